"""A real Prometheus server on loopback, loaded with DCGM-shaped series through ``promtool``.

Debian's ``prometheus`` package provides both binaries; ``.ci/run`` installs it when missing. Tests
that need it skip (with the reason) where it is absent, so a laptop without it still runs the rest.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
requires_prometheus = pytest.mark.skipif(
    not (PROMETHEUS and PROMTOOL), reason="Debian package 'prometheus' is not installed (.ci/run installs it)"
)


def openmetrics(series: Mapping[tuple[tuple[str, str], ...], float], *, end: float, minutes: int = 15) -> str:
    """One gauge sample every 15 s for ``minutes`` up to ``end``, per labelled series."""
    lines = ["# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).", "# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    stamps = range(int(end) - 60 * minutes, int(end) + 1, 15)
    for labels, value in series.items():
        text = ",".join(f'{key}="{val}"' for key, val in labels)
        lines += [f"DCGM_FI_DEV_GPU_UTIL{{{text}}} {value} {stamp}" for stamp in stamps]
    return "\n".join([*lines, "# EOF"]) + "\n"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def prometheus_with(series: Mapping[tuple[tuple[str, str], ...], float], workdir: Path) -> Iterator[str]:
    """Backfill ``series`` (ending 15 s ago), start Prometheus on a free port, yield its URL."""
    assert PROMETHEUS and PROMTOOL
    data = workdir / "tsdb"
    source = workdir / "series.om"
    source.write_text(openmetrics(series, end=time.time() - 15))
    subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
                   check=True, capture_output=True)  # fmt: skip
    config = workdir / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1m\n")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = (workdir / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={data}",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=30d"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Prometheus did not start: {(workdir / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()
