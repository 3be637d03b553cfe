"""One declaration per setting (``adapters.settings.setting``): the environment, the flags, the CDK
context's variables and the messages all read it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from adapters.settings import (
    add_flags,
    context_keys,
    context_named,
    environment,
    flag_name,
    flags_named,
    given,
    load_settings,
    setting,
)
from scheduler_core.errors import ConfigError


@dataclass(frozen=True)
class Example:
    max_age_s: float = setting("MAX_AGE_S", 180.0, "refuse an older `snapshot`", context="maxAgeS")
    uri: str = setting("SNAPSHOT_URI", "", "where it is; with `MAX_AGE_S`", flag="--snapshot")
    limit: int = setting("LIMIT", 5, "at most 5% of this")
    dry_run: bool = setting("DRY_RUN", False, "write nothing")

    def problems(self) -> list[str]:
        return [f"MAX_AGE_S: must be >= 0, got {self.max_age_s}"] if self.max_age_s < 0 else []


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


def test_messages_name_flags_on_a_command_line_and_context_keys_in_the_cdk_app() -> None:
    message = "MAX_AGE_S: must be >= 0, got -1; SNAPSHOT_URI: bad"
    assert flags_named(Example, message) == "--max-age-s: must be >= 0, got -1; --snapshot: bad"
    assert context_named(Example, message) == "maxAgeS: must be >= 0, got -1; SNAPSHOT_URI: bad"
    with pytest.raises(ConfigError, match="MAX_AGE_S: must be >= 0"):
        load_settings(Example, {}, {"max_age_s": -1.0})


def test_the_lambda_environment_holds_the_settings_that_declare_a_context_key() -> None:
    assert context_keys(Example) == {"max_age_s": "maxAgeS"}
    assert environment(Example, Example(max_age_s=240, uri="ignored")) == {"MAX_AGE_S": "240"}
