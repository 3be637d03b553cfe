"""Timing helpers shared by the benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np


def time_us(fn: Callable[[], Any], repeat: int, warmup: int = 3) -> dict[str, float]:
    """Run ``fn`` ``warmup`` times untimed, then ``repeat`` times; p50/p99/mean in microseconds."""
    for _ in range(warmup):
        fn()
    samples = np.empty(repeat)
    for i in range(repeat):
        started = time.perf_counter_ns()
        fn()
        samples[i] = (time.perf_counter_ns() - started) / 1000
    return {
        "p50_us": round(float(np.percentile(samples, 50)), 1),
        "p99_us": round(float(np.percentile(samples, 99)), 1),
        "mean_us": round(float(samples.mean()), 1),
        "n": repeat,
    }
