"""What several commands share: the usage error, JSON input files, and the score and locality flags."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from scheduler_core.errors import InvalidArgsError
from scheduler_core.extender.wire import decode_json
from scheduler_core.scoring.gpu_fit import ScoreWeights
from scheduler_core.scoring.locality import DEFAULT_LABEL_KEYS, LocalitySettings


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


def read_json(path: Path, what: str) -> Any:
    """The JSON document in ``path``; :class:`UsageError` naming ``what`` and the file otherwise."""
    try:
        return decode_json(path.read_bytes())
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror}") from exc
    except InvalidArgsError as exc:
        raise UsageError(f"{what} {path}: {exc}") from exc


def int_list(text: str) -> list[int]:
    """``1000,10000``: positive integers (an argparse ``type``)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {text!r}") from exc
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def add_scoring(parser: argparse.ArgumentParser) -> None:
    """The score weights and the locality settings, as flags."""
    parser.add_argument("--weight-fit", type=float, default=ScoreWeights.fit, help="best-fit weight (default 0.7)")
    parser.add_argument(
        "--weight-utilization", type=float, default=ScoreWeights.utilization, help="low-utilisation weight (0.3)"
    )
    parser.add_argument(
        "--weight-locality", type=float, default=ScoreWeights.locality, help="network-locality weight (default 0.5)"
    )
    parser.add_argument(
        "--locality-label-keys",
        default=",".join(DEFAULT_LABEL_KEYS),
        help="label keys peers may select on (default app,app.kubernetes.io/name)",
    )
    parser.add_argument("--zone-alpha", type=float, default=LocalitySettings.zone_alpha, help="same-zone value (0.5)")
    parser.add_argument(
        "--locality-self-weight",
        type=float,
        default=LocalitySettings.self_weight,
        help="weight of a pod's own workload among its peers (1.0; 0 turns it off)",
    )


def weights(args: argparse.Namespace) -> ScoreWeights:
    return ScoreWeights(fit=args.weight_fit, utilization=args.weight_utilization, locality=args.weight_locality)


def locality(args: argparse.Namespace) -> LocalitySettings:
    keys = tuple(key.strip() for key in args.locality_label_keys.split(",") if key.strip())
    return LocalitySettings(label_keys=keys, zone_alpha=args.zone_alpha, self_weight=args.locality_self_weight)
