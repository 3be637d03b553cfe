"""A real Prometheus server on loopback, loaded with gauge series through ``promtool`` backfill.

Debian's ``prometheus`` package provides both binaries; ``.ci/run`` installs it when missing. The AMP
query tests and the deletion-cost benchmark use it: AMP speaks the same HTTP API (DESIGN section 7).
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

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
MISSING = "Debian package 'prometheus' is not installed (.ci/run installs it)"


# A value is a constant (a gauge), or (start, increase per second): a counter, as a histogram's
# ``_bucket``/``_count``/``_sum`` series are too.
Series = Mapping[tuple[tuple[str, str], ...], float | tuple[float, float]]


def openmetrics(families: Mapping[str, Series], *, end: float, minutes: int = 15) -> str:
    """One sample every 15 s for ``minutes`` up to ``end``, per labelled series of each metric.

    Every family is declared a gauge: Prometheus stores samples the same way whatever the type, and
    ``rate()`` works on any series, so a growing "gauge" stands in for a counter.
    """
    lines = []
    first = int(end) - 60 * minutes
    stamps = range(first, int(end) + 1, 15)
    for metric, series in families.items():
        lines.append(f"# TYPE {metric} gauge")
        for labels, value in series.items():
            text = ",".join(f'{key}="{val}"' for key, val in labels)
            if isinstance(value, tuple):
                start, per_s = value
                lines += [f"{metric}{{{text}}} {start + per_s * (stamp - first)} {stamp}" for stamp in stamps]
            else:
                lines += [f"{metric}{{{text}}} {value} {stamp}" for stamp in stamps]
    return "\n".join([*lines, "# EOF"]) + "\n"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def prometheus_with(
    families: Mapping[str, Series], workdir: Path, *, minutes: int = 15, config: str = ""
) -> Iterator[str]:
    """Backfill ``{metric: {labels: value}}`` (ending 15 s ago), start Prometheus on a free port, yield its URL.

    ``config`` replaces the default configuration (nothing scraped), e.g. to scrape a local exporter.
    """
    if not (PROMETHEUS and PROMTOOL):
        raise RuntimeError(MISSING)
    data = workdir / "tsdb"
    if families:
        source = workdir / "series.om"
        source.write_text(openmetrics(families, end=time.time() - 15, minutes=minutes))
        subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
                       check=True, capture_output=True)  # fmt: skip
    config_path = workdir / "prometheus.yml"
    config_path.write_text(config or "global:\n  scrape_interval: 1m\n")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = (workdir / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config_path}", f"--storage.tsdb.path={data}",
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
