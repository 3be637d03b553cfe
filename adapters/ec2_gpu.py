"""EC2 ``DescribeInstanceTypes`` GpuInfo by instance type, batched and cached across invocations.

Instance types do not change their GPUs, so an answer (including "no GPUs" and "no such type") is
kept for the life of the process: a warm Lambda asks EC2 only about types it has not seen.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from typing import Any

from scheduler_core.k8s.node_labels import GpuInfo, gpu_info_from_ec2

log = logging.getLogger(__name__)

BATCH = 100  # DescribeInstanceTypes accepts at most 100 types per call
_UNKNOWN_TYPES = re.compile(r"\[([^\]]*)\]")


class GpuInfoCatalog:
    """``lookup(types)`` -> ``{type: (GpuInfo | None, reason)}``, asking EC2 only for new types."""

    def __init__(self, ec2_client: Any) -> None:
        self._ec2 = ec2_client
        self._known: dict[str, tuple[GpuInfo | None, str]] = {}
        self._lock = threading.Lock()
        self.calls = 0

    def lookup(self, instance_types: Iterable[str]) -> dict[str, tuple[GpuInfo | None, str]]:
        wanted = sorted({t for t in instance_types if t})
        with self._lock:
            missing = [t for t in wanted if t not in self._known]
            for start in range(0, len(missing), BATCH):
                self._fetch(missing[start : start + BATCH])
            return {t: self._known[t] for t in wanted if t in self._known}

    def _fetch(self, batch: list[str]) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        while batch:
            try:
                self.calls += 1
                pages = self._ec2.get_paginator("describe_instance_types").paginate(InstanceTypes=batch)
                found = {item["InstanceType"]: item.get("GpuInfo") for page in pages for item in page["InstanceTypes"]}
            except ClientError as exc:
                error = exc.response.get("Error", {})
                unknown = _unknown_types(error.get("Message", "")) & set(batch)
                if error.get("Code") != "InvalidInstanceType" or not unknown:
                    log.warning("DescribeInstanceTypes failed for %s: %s", batch, error)
                    return  # not cached: the next run asks again
                for name in unknown:
                    self._known[name] = (None, f"instance type {name} does not exist in EC2")
                batch = [t for t in batch if t not in unknown]
                continue
            except BotoCoreError as exc:
                log.warning("DescribeInstanceTypes failed for %s: %s", batch, exc)
                return
            for name in batch:
                self._known[name] = gpu_info_from_ec2(name, found.get(name))
            return


def _unknown_types(message: str) -> set[str]:
    """EC2 names the bad types: "The following supplied instance types do not exist: [a, b]"."""
    match = _UNKNOWN_TYPES.search(message)
    return {part.strip() for part in match.group(1).split(",")} if match else set()
