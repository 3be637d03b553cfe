"""What several commands share: the usage error, JSON input files, and the score and locality flags (derived
from the extender's settings, :func:`add_scoring`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from adapters.settings import add_flags, flag_names, given
from application.extender.settings import ExtenderSettings
from scheduler_core.errors import ConfigError, InvalidArgsError


class UsageError(Exception):
    """Bad arguments or input files: exit code 2."""


def from_checkout(module: str, name: str, how: str) -> Any:
    """``name`` from ``module`` of a source checkout (``bench/`` and ``testing/`` are not installed), or a
    :class:`UsageError` that says so and ``how`` to run it there."""
    import importlib

    try:
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module.startswith(exc.name):
            raise
        raise UsageError(
            f"this must run from a source checkout, not an installed package: clone the repository and {how}"
        ) from exc


def read_document(path: Path | str, what: str) -> Any:
    """The JSON or YAML document in ``path`` (``-``: stdin); :class:`UsageError` naming ``what`` and the file
    otherwise (:func:`adapters.cluster_file.decode_document`)."""
    from adapters.cluster_file import decode_document

    try:
        data = sys.stdin.buffer.read() if str(path) == "-" else Path(path).read_bytes()
        return decode_document(data)
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror}") from exc
    except InvalidArgsError as exc:
        raise UsageError(f"{what} {path}: {exc}") from exc


SCORING = (
    "weight_fit",
    "weight_utilization",
    "weight_locality",
    "locality_label_keys",
    "locality_zone_alpha",
    "locality_zone_values",
    "locality_self_weight",
)
"""The extender settings (``application.extender.settings.ExtenderSettings``) that shape a score, as flags."""


def add_scoring(parser: argparse.ArgumentParser) -> None:
    """The score weights and the locality settings, as flags derived from their declarations."""
    add_flags(parser, ExtenderSettings, SCORING)


def extender_settings(
    args: argparse.Namespace,
    names: Sequence[str] = SCORING,
    *,
    environ: Mapping[str, str] | None = None,
    values: Mapping[str, Any] | None = None,
) -> ExtenderSettings:
    """The extender settings: the flags ``names`` that were given (:func:`adapters.settings.add_flags`), over
    ``values``, over the variables in ``environ`` (none by default), over the declared defaults;
    :class:`UsageError` naming each bad flag."""
    try:
        return ExtenderSettings.from_env(
            environ or {}, named_by=flag_names(ExtenderSettings), **{**(values or {}), **given(args, names)}
        )
    except ConfigError as exc:
        raise UsageError(str(exc)) from exc
