"""A cluster source read from a file, for ``serve --cluster`` and ``explain --cluster``: development, tests and
a first look at a cluster of one's own, beside the snapshot (:mod:`adapters.snapshot_store`) and the live
watch (:mod:`adapters.live_state`). The file is JSON or YAML: ``{"nodes": [v1 Node], "pods": [v1 Pod]}``
(and DRA's objects where given), or what ``kubectl get nodes,pods -A -o json`` (or ``-o yaml``) prints
(:meth:`~scheduler_core.state.cluster.ClusterState.from_document`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scheduler_core.errors import InvalidArgsError
from scheduler_core.state.cluster import ClusterState

log = logging.getLogger(__name__)


class ClusterFile:
    """A cluster JSON file (``{"nodes": [...], "pods": [...]}``) re-read when it changes.

    The file is stat'ed at most every ``refresh_s`` seconds and re-parsed when its size or mtime
    changed. A file that fails to parse on reload keeps the previous state in service (and logs why),
    so a half-written file never empties the cluster.
    """

    def __init__(
        self, path: str | Path, *, refresh_s: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = Path(path)
        self.refresh_s = refresh_s
        self._clock = clock
        self._lock = threading.Lock()
        # Stat before reading: a change made while we read shows up as a new stamp next time.
        try:
            self._stamp = self._stat()
        except OSError as exc:
            raise InvalidArgsError(f"cannot read cluster file {self.path}: {exc.strerror}") from exc
        self._state = load_cluster_file(self.path)
        self._checked_at = clock()

    def _stat(self) -> tuple[int, int]:
        stat = self.path.stat()
        return stat.st_mtime_ns, stat.st_size

    def __call__(self) -> ClusterState:
        now = self._clock()
        if now - self._checked_at < self.refresh_s:
            return self._state
        with self._lock:
            if now - self._checked_at >= self.refresh_s:
                self._checked_at = now
                self._reload_if_changed()
        return self._state

    def _reload_if_changed(self) -> None:
        try:
            stamp = self._stat()
            if stamp == self._stamp:
                return
            self._state = load_cluster_file(self.path)
            self._stamp = stamp
        except (OSError, InvalidArgsError) as exc:
            log.warning("keeping the previous cluster state: %s", exc)


def load_cluster_file(path: Path) -> ClusterState:
    """Read and validate a cluster file (JSON or YAML); problems are raised as :class:`InvalidArgsError`."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidArgsError(f"cannot read cluster file {path}: {exc.strerror}") from exc
    try:
        state = ClusterState.from_document(decode_document(data))
    except InvalidArgsError as exc:
        raise InvalidArgsError(f"{path}: {exc}") from exc
    for problem in state.problems:
        log.warning("%s: %s", path, problem)
    return state


def decode_document(data: bytes) -> Any:
    """A JSON document, or a YAML one (what ``kubectl -o yaml`` and pod manifests are): JSON when the text
    starts as JSON does, else YAML (one document; ``yaml.safe_load``, which builds no object but plain
    data). :class:`InvalidArgsError` saying which it was read as, and why not.

    Numbers in resource maps become text, as the API server returns them (:func:`_quantities_as_text`).

    >>> decode_document(b'{"kind": "Pod"}'), decode_document(b"kind: Pod\\nspec: {}\\n")
    ({'kind': 'Pod'}, {'kind': 'Pod', 'spec': {}})
    >>> decode_document(b"resources: {requests: {cpu: 0.5, memory: 1Gi, nvidia.com/gpu: 1}}")
    {'resources': {'requests': {'cpu': '0.5', 'memory': '1Gi', 'nvidia.com/gpu': '1'}}}
    """
    return _quantities_as_text(_decoded(data))


RESOURCE_MAPS = frozenset({"requests", "limits", "overhead", "allocatable", "capacity"})
"""The maps of quantities in Kubernetes objects: a file written by hand may give one as a number
(``cpu: 0.5``), which the API server takes, and kubectl prints as text."""


def _quantities_as_text(document: Any) -> Any:
    """``document`` with every number in a :data:`RESOURCE_MAPS` map as the text the API server would
    return it as (``0.5`` -> ``"0.5"``). Iterative: a deeply nested document costs no recursion."""
    stack = [document]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if key in RESOURCE_MAPS and isinstance(value, dict):
                    for name, amount in value.items():
                        if isinstance(amount, int | float) and not isinstance(amount, bool):
                            value[name] = str(amount)
                stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)
    return document


def _decoded(data: bytes) -> Any:
    if data.lstrip()[:1] in (b"{", b"["):
        try:
            return json.loads(data)
        except RecursionError as exc:
            raise InvalidArgsError("nested too deeply to be a Kubernetes object") from exc
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            raise InvalidArgsError(f"not valid JSON: {exc}") from exc
    import yaml  # only for YAML: the Lambdas never read one

    try:
        text = data.decode("utf-8")
        return yaml.safe_load(text)
    except UnicodeDecodeError as exc:
        raise InvalidArgsError(f"not UTF-8 text: {exc}") from exc
    except yaml.YAMLError as exc:
        raise InvalidArgsError(f"not JSON, nor YAML: {str(exc).splitlines()[0]}") from exc
