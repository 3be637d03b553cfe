"""What the product deploys, exactly: the documents ``gpu-scheduler scheduler-config`` writes, run as its
own process (the harness never imports the CLI), its output kept per argument list."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import yaml

from manifests.scheduler import CONFIG_FILE


@lru_cache(maxsize=32)
def _scheduler_config_output(argv: tuple[str, ...]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "gpu_scheduler", "scheduler-config", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"gpu-scheduler scheduler-config {' '.join(argv)} exited with {done.returncode}: {done.stderr}"
        )
    return done.stdout


def generated_manifests(argv: Sequence[str]) -> list[dict[str, Any]]:
    """Every document ``gpu-scheduler scheduler-config ARGV`` writes: what the product deploys, exactly. The
    command runs as its own process (the doubles never import the CLI); its output is kept per ``argv``."""
    return [document for document in yaml.safe_load_all(_scheduler_config_output(tuple(argv))) if document]


def generated_scheduler_config(argv: Sequence[str], which: str = CONFIG_FILE) -> dict[str, Any]:
    """The KubeSchedulerConfiguration inside what ``gpu-scheduler scheduler-config ARGV`` writes: the
    ConfigMap the product deploys, exactly; ``which`` of its two (``break-glass.yaml``: no extender)."""
    for document in generated_manifests(argv):
        if document.get("kind") == "ConfigMap" and document["metadata"]["name"].endswith("-config"):
            config: dict[str, Any] = yaml.safe_load(document["data"][which])
            return config
    raise RuntimeError("gpu-scheduler scheduler-config wrote no scheduler ConfigMap")
