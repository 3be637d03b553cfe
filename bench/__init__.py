"""Benchmarks, run through ``gpu-scheduler bench ...``; each prints JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any


def check_choices(names: Sequence[str], choices: Iterable[str], flag: str) -> None:
    """ValueError naming ``flag``, the names not among ``choices``, and the choices.

    >>> check_choices(["fgd", "first_fit"], ["fgd", "bestfit"], "--policies")
    Traceback (most recent call last):
    ValueError: --policies: unknown first_fit; choose from fgd, bestfit
    """
    allowed = list(choices)
    unknown = sorted(set(names) - set(allowed))
    if unknown:
        raise ValueError(f"{flag}: unknown {', '.join(unknown)}; choose from {', '.join(allowed)}")


@contextmanager
def kube_double_process(*flags: str) -> Iterator[dict[str, Any]]:
    """``python -m testing.kube_double FLAGS`` in a process of its own, so that what a suite measures is
    the refresher's alone: the double's ready line (``url``, ``token``); on the way out its stdin is
    closed, which stops it, and it is waited for (60 s at most)."""
    double = subprocess.Popen(
        [sys.executable, "-m", "testing.kube_double", *flags], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert double.stdout is not None
        yield json.loads(double.stdout.readline())
    finally:
        if double.stdin:
            double.stdin.close()
        double.wait(timeout=60)
