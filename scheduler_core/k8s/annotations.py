"""Parsing the pod annotations the scheduler owns: ``gpu-scheduler.io/peers`` and ``gpu-scheduler.io/assigned-gpus``.

Each parser raises :class:`~scheduler_core.errors.InvalidPodError` naming the annotation, the part
at fault and the value that arrived.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from scheduler_core.errors import InvalidPodError
from scheduler_core.k8s.names import ASSIGNED_GPUS_ANNOTATION, MILLI_PER_GPU, PEERS_ANNOTATION, SCHEDULER_NAME
from scheduler_core.k8s.quantity import plain_int

Pairs = tuple[tuple[int, int], ...]
"""``((gpu index, milli), ...)``, sorted by index: what one pod holds on one node."""

MAX_PEERS = 32
MAX_PEER_WEIGHT = 1000.0

# Label key (optional DNS prefix + name) and label value, as the API server validates them.
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME}$")
LABEL_VALUE = re.compile(rf"^({_NAME})?$")


@dataclass(frozen=True)
class Peer:
    """One ``key=value`` selector and its relative traffic weight."""

    key: str
    value: str
    weight: float = 1.0

    @property
    def selector(self) -> str:
        return f"{self.key}={self.value}"


def parse_peers(value: object) -> tuple[Peer, ...]:
    """Parse ``gpu-scheduler.io/peers``.

    Compact form: ``key=value[:weight]`` items separated by commas; JSON: a list of
    ``{"selector": "key=value", "weight": 3}`` or an object ``{"key=value": 3}``. Weights are
    positive numbers up to 1000 (default 1). Raises :class:`InvalidPodError` naming the part at fault.

    >>> [(p.selector, p.weight) for p in parse_peers("app=feature-store:3, app=redis")]
    [('app=feature-store', 3.0), ('app=redis', 1.0)]
    """
    where = f"annotation {PEERS_ANNOTATION}"
    if not isinstance(value, str) or not value.strip():
        raise InvalidPodError(f"{where}: expected selectors such as 'app=feature-store:3,app=redis:1', got {value!r}")
    text = value.strip()
    items: list[tuple[str, object]] = []
    if text[0] in "[{":
        try:
            document = json.loads(text)
        except ValueError as exc:
            raise InvalidPodError(f"{where}: not valid JSON: {exc}") from exc
        if isinstance(document, dict):
            items = list(document.items())
        elif isinstance(document, list) and all(isinstance(d, dict) for d in document):
            items = [(d.get("selector"), d.get("weight", 1)) for d in document]
        else:
            raise InvalidPodError(f"{where}: JSON must be an object or a list of objects with 'selector'")
    else:
        for part in text.split(","):
            selector, _, weight = part.strip().partition(":")
            items.append((selector, weight if weight else 1))
    if len(items) > MAX_PEERS:
        raise InvalidPodError(f"{where}: at most {MAX_PEERS} peers, got {len(items)}")
    return tuple(_peer(selector, weight, where) for selector, weight in items)


def _peer(selector: object, weight: object, where: str) -> Peer:
    if not isinstance(selector, str) or "=" not in selector:
        raise InvalidPodError(f"{where}: {selector!r} is not a key=value selector")
    key, _, value = selector.strip().partition("=")
    if not LABEL_KEY.match(key):
        raise InvalidPodError(f"{where}: {key!r} in {selector!r} is not a label key")
    if not value or not LABEL_VALUE.match(value):
        raise InvalidPodError(f"{where}: {value!r} in {selector!r} is not a label value")
    try:
        number = float(weight) if isinstance(weight, str | int | float) and not isinstance(weight, bool) else math.nan
    except ValueError:
        number = math.nan
    if not (0.0 < number <= MAX_PEER_WEIGHT):
        limit = f"(0, {MAX_PEER_WEIGHT:g}]"
        raise InvalidPodError(f"{where}: weight {weight!r} of {selector!r} must be a number in {limit}")
    return Peer(key, value, number)


def trusted_assigned_gpus(value: object, scheduler_name: object, gpus: int, milli: int) -> Pairs:
    """The ``assigned-gpus`` annotation of a pod, parsed, when it may be believed: the pod names this
    scheduler's profile, requests a GPU (``gpus`` of ``nvidia.com/gpu``, ``milli`` of
    ``gpu-scheduler.io/gpu-milli``), and the annotation assigns exactly that much (each whole GPU
    entire). Anyone who may edit a pod can write an annotation; only the extender's bind writes one
    that fits these, so a CPU-only pod claiming "0:1000,...,7:1000" cannot zero a node's GPUs.

    >>> trusted_assigned_gpus("0:250", "gpu-scheduler", 0, 250)
    ((0, 250),)
    >>> trusted_assigned_gpus("0:1000,1:1000", "gpu-scheduler", 0, 0)
    Traceback (most recent call last):
    ...
    scheduler_core.errors.InvalidPodError: annotation gpu-scheduler.io/assigned-gpus ignored: the pod requests no GPU

    Raises
    ------
    InvalidPodError
        The annotation is malformed, or is not to be trusted on this pod; the message says which.
    """
    where = f"annotation {ASSIGNED_GPUS_ANNOTATION} ignored"
    if scheduler_name != SCHEDULER_NAME:
        raise InvalidPodError(f"{where}: the pod is not scheduled by {SCHEDULER_NAME!r}")
    if gpus <= 0 and milli <= 0:
        raise InvalidPodError(f"{where}: the pod requests no GPU")
    pairs = parse_assigned_gpus(value)
    assigned = sum(m for _, m in pairs)
    requested = gpus * MILLI_PER_GPU + milli
    if assigned != requested:
        raise InvalidPodError(f"{where}: it assigns {assigned} milli and the pod requests {requested}")
    if milli % MILLI_PER_GPU == 0 and any(m != MILLI_PER_GPU for _, m in pairs):
        raise InvalidPodError(f"{where}: the pod requests whole GPUs and it assigns parts of some")
    return pairs


def parse_assigned_gpus(value: object) -> tuple[tuple[int, int], ...]:
    """Parse ``"index:milli,..."``; the same index may not appear twice.

    Raises
    ------
    InvalidPodError
        The value is not such a list, an index is negative, or a milli amount is not in 1..1000.

    >>> parse_assigned_gpus("0:500, 3:1000")
    ((0, 500), (3, 1000))
    >>> format_assigned_gpus(((3, 250), (1, 250)))
    '1:250,3:250'
    """
    where = f"annotation {ASSIGNED_GPUS_ANNOTATION}={value!r}"
    if not isinstance(value, str) or not value.strip():
        raise InvalidPodError(f"{where}: expected index:milli pairs such as '0:500'")
    pairs: dict[int, int] = {}
    for part in value.split(","):
        index_text, sep, milli_text = part.strip().partition(":")
        index, milli = plain_int(index_text, max_digits=4), plain_int(milli_text, max_digits=4)
        if not sep or index is None or milli is None:
            raise InvalidPodError(f"{where}: {part.strip()[:32]!r} is not index:milli")
        if not 1 <= milli <= MILLI_PER_GPU:
            raise InvalidPodError(f"{where}: milli {milli} on GPU {index} is outside 1..{MILLI_PER_GPU}")
        if index in pairs:
            raise InvalidPodError(f"{where}: GPU {index} appears twice")
        pairs[index] = milli
    return tuple(pairs.items())


def format_assigned_gpus(pairs: Iterable[tuple[int, int]]) -> str:
    """Canonical annotation text: pairs sorted by GPU index."""
    return ",".join(f"{index}:{milli}" for index, milli in sorted(pairs))
