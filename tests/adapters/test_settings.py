"""One declaration per setting (``adapters.settings.setting``): the environment, the flags, the CDK
context's variables and the messages all read it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from adapters.settings import (
    add_flags,
    context_keys,
    context_names,
    env_names,
    environment,
    flag_name,
    flag_names,
    given,
    load_settings,
    setting,
)
from scheduler_core.errors import ConfigError, Namer


@dataclass(frozen=True)
class Example:
    max_age_s: float = setting("MAX_AGE_S", 180.0, "refuse an older `snapshot`", context="maxAgeS")
    uri: str = setting("SNAPSHOT_URI", "", "where it is; with `MAX_AGE_S`", flag="--snapshot")
    limit: int = setting("LIMIT", 5, "at most 5% of this")
    dry_run: bool = setting("DRY_RUN", False, "write nothing")

    def problems(self, name: Namer) -> list[str]:
        found = [f"{name('max_age_s')}: must be >= 0, got {self.max_age_s}"] if self.max_age_s < 0 else []
        return found + ([f"{name('uri')}: bad"] if self.uri == "bad" else [])


def parser_for(**defaults: object) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_flags(parser, Example, ["max_age_s", "uri", "limit", "dry_run"], defaults=defaults)
    return parser


def test_a_flag_is_named_after_its_field_unless_it_declares_one() -> None:
    assert [flag_name(Example, n) for n in ("max_age_s", "uri", "dry_run")] == [
        "--max-age-s",
        "--snapshot",
        "--dry-run",
    ]


def test_only_the_flags_given_override_and_the_declared_default_stays_the_one_default() -> None:
    names = ["max_age_s", "uri", "limit", "dry_run"]
    assert given(parser_for().parse_args([]), names) == {}
    args = parser_for().parse_args(["--max-age-s", "60", "--snapshot", "s3://b/k", "--dry-run"])
    assert given(args, names) == {"max_age_s": 60.0, "uri": "s3://b/k", "dry_run": True}
    settings = load_settings(Example, {"LIMIT": "7"}, given(args, names))
    assert settings == Example(max_age_s=60.0, uri="s3://b/k", limit=7, dry_run=True)


def test_a_flag_is_parsed_by_the_fields_type(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser_for().parse_args(["--limit", "many"])
    assert "argument --limit: expected int, got 'many'" in capsys.readouterr().err


def test_the_help_is_the_doc_with_the_default_and_variables_named_as_flags() -> None:
    text = " ".join(parser_for(limit=9).format_help().split())
    assert "--max-age-s MAX_AGE_S refuse an older snapshot (default 180.0)" in text
    assert "--snapshot URI where it is; with --max-age-s" in text  # no default shown for an empty one
    assert "at most 5% of this (default 9)" in text  # a command's own default, and % survives argparse


def test_messages_name_each_setting_as_its_caller_does_variables_flags_or_context_keys() -> None:
    """The check names each field by the caller's namer: nothing renames a message afterwards."""
    bad = Example(max_age_s=-1.0, uri="bad")
    assert bad.problems(env_names(Example)) == ["MAX_AGE_S: must be >= 0, got -1.0", "SNAPSHOT_URI: bad"]
    assert bad.problems(flag_names(Example)) == ["--max-age-s: must be >= 0, got -1.0", "--snapshot: bad"]
    assert bad.problems(context_names(Example)) == ["maxAgeS: must be >= 0, got -1.0", "SNAPSHOT_URI: bad"]
    with pytest.raises(ConfigError, match=r"^MAX_AGE_S: must be >= 0, got -1\.0; SNAPSHOT_URI: bad$"):
        load_settings(Example, {}, {"max_age_s": -1.0, "uri": "bad"})
    with pytest.raises(ConfigError, match=r"^--max-age-s: must be >= 0, got -1\.0; --snapshot: bad$"):
        load_settings(Example, {}, {"max_age_s": -1.0, "uri": "bad"}, flag_names(Example))


def test_the_lambda_environment_holds_the_settings_that_declare_a_context_key() -> None:
    assert context_keys(Example) == {"max_age_s": "maxAgeS"}
    assert environment(Example, Example(max_age_s=240, uri="ignored")) == {"MAX_AGE_S": "240"}
