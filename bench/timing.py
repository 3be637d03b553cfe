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


def run_threads(target: Callable[[int], Any], threads: int) -> float:
    """Run ``target(0)`` .. ``target(threads - 1)`` on as many threads at once; the wall time in seconds."""
    import threading

    started = time.perf_counter()
    workers = [threading.Thread(target=target, args=(worker,)) for worker in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return time.perf_counter() - started
