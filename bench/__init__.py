"""Benchmarks, run through ``gpu-scheduler bench ...``; each prints JSON."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


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
