"""Parsing the pod annotations the scheduler owns: ``gpu-scheduler.io/peers`` and ``gpu-scheduler.io/assigned-gpus``.

Each parser raises :class:`~scheduler_core.errors.InvalidPodError` naming the annotation, the part
at fault and the value that arrived (cut to 64 characters). Anyone who may create a pod writes these
values, so every parser bounds what it reads before it reads it: the length of the value, the nesting of
JSON and the digits of a number. Nothing else escapes: no ``RecursionError`` from deep JSON, no
``OverflowError`` from a 4,000-digit weight, no reply that echoes a megabyte.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduler_core.errors import InvalidPodError
from scheduler_core.k8s.names import (
    ASSIGNED_GPUS_ANNOTATION,
    CDI_DEVICE_ANNOTATION,
    CDI_DEVICE_KIND,
    GPU_PORTION_ANNOTATION,
    MILLI_PER_GPU,
    MPS_MEMORY_ANNOTATION,
    MPS_THREADS_ANNOTATION,
    PEERS_ANNOTATION,
    SCHEDULER_NAME,
    VISIBLE_DEVICES_ANNOTATION,
)
from scheduler_core.k8s.quantity import plain_int, shown

Pairs = tuple[tuple[int, int], ...]
"""``((gpu index, milli), ...)``, sorted by index: what one pod holds on one node."""

MAX_PEERS = 32
MAX_PEER_WEIGHT = 1000.0
MAX_PEERS_CHARS = 16384
"""Longest ``peers`` value read. The longest 32 selectors (a 317-character label key, a 63-character
value) with weights take about 13,500 characters in the JSON list form."""
MAX_PEERS_JSON_DEPTH = 2
"""A list of objects, the deepest form :func:`parse_peers` takes. :func:`json.loads` recurses once per
level and raises ``RecursionError`` near 1,000, so the depth is counted before it runs."""
MAX_WEIGHT_CHARS = 32
"""Longest weight read; ``float`` of a 4,000-digit JSON integer raises ``OverflowError``."""
MAX_ASSIGNED_GPUS_CHARS = 4096
"""Longest ``assigned-gpus`` value read: 400 ``index:milli`` pairs, far past any node's GPUs."""

# Label key (optional DNS prefix + name) and label value, as the API server validates them.
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME}$")
LABEL_VALUE = re.compile(rf"^({_NAME})?$")
# A weight: ASCII decimal digits, an optional fraction and exponent (the JSON number grammar, unsigned).
# float() alone also takes "1_000", "١٢" (Arabic-Indic digits), "inf" and "nan".
_WEIGHT = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
# One JSON string (its closing quote optional, so an unterminated one ends the scan instead of
# backtracking) or one bracket: what :func:`_json_depth` counts.
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.DOTALL)


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
    positive numbers up to 1000 (default 1). The value is at most :data:`MAX_PEERS_CHARS` long, its
    JSON nests at most :data:`MAX_PEERS_JSON_DEPTH` deep, a weight has at most
    :data:`MAX_WEIGHT_CHARS` characters. Raises :class:`InvalidPodError` naming the part at fault.

    >>> [(p.selector, p.weight) for p in parse_peers("app=feature-store:3, app=redis")]
    [('app=feature-store', 3.0), ('app=redis', 1.0)]
    >>> parse_peers('{"app=a": ' + "9" * 4000 + "}")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    scheduler_core.errors.InvalidPodError: ...: weight 999...9... (4000 characters) of 'app=a' must be a number in ...
    >>> parse_peers("[" * 100000)
    Traceback (most recent call last):
    ...
    scheduler_core.errors.InvalidPodError: annotation gpu-scheduler.io/peers: 100000 characters; at most 16384
    """
    where = f"annotation {PEERS_ANNOTATION}"
    if not isinstance(value, str) or not value.strip():
        raise InvalidPodError(
            f"{where}: expected selectors such as 'app=feature-store:3,app=redis:1', got {shown(value)}"
        )
    if len(value) > MAX_PEERS_CHARS:
        raise InvalidPodError(f"{where}: {len(value)} characters; at most {MAX_PEERS_CHARS}")
    text = value.strip()
    items: list[tuple[object, object]] = []
    if text[0] in "[{":
        document = _peers_json(text, where)
        if isinstance(document, dict):
            items = list(document.items())
        elif isinstance(document, list) and all(isinstance(d, dict) for d in document):
            items = [(d.get("selector"), d.get("weight", "1")) for d in document]
        else:
            raise InvalidPodError(f"{where}: JSON must be an object or a list of objects with 'selector'")
    else:
        for part in text.split(","):
            selector, _, weight = part.strip().partition(":")
            items.append((selector, weight if weight else "1"))
    if len(items) > MAX_PEERS:
        raise InvalidPodError(f"{where}: at most {MAX_PEERS} peers, got {len(items)}")
    return tuple(_peer(selector, weight, where) for selector, weight in items)


class _JsonNumber(str):
    """A JSON number (or ``NaN``/``Infinity``) kept as its text, so :func:`_peer` reads it with the
    bounds a weight written as a string has; shown without quotes, as JSON has it."""

    __slots__ = ()

    def __repr__(self) -> str:
        text = str.__str__(self)
        return text if len(text) <= 64 else f"{text[:61]}... ({len(text)} characters)"


def _peers_json(text: str, where: str) -> object:
    """``text`` decoded, with numbers as :class:`_JsonNumber`: ``int`` would refuse one past 4,300
    digits and ``float`` overflow on it; the weight's own bounds apply instead."""
    depth = _json_depth(text)
    if depth > MAX_PEERS_JSON_DEPTH:
        raise InvalidPodError(f"{where}: JSON nested {depth} deep; at most {MAX_PEERS_JSON_DEPTH} (a list of objects)")
    try:
        return json.loads(text, parse_int=_JsonNumber, parse_float=_JsonNumber, parse_constant=_JsonNumber)
    except ValueError as exc:
        raise InvalidPodError(f"{where}: not valid JSON: {exc}") from exc


def _json_depth(text: str) -> int:
    """Deepest nesting of ``[`` and ``{`` outside JSON strings, in one linear scan.

    >>> _json_depth('[{"selector": "a=[b]"}]'), _json_depth("[" * 5000)
    (2, 5000)
    """
    depth = deepest = 0
    for token in _JSON_TOKEN.findall(text):
        if token == "[" or token == "{":
            depth += 1
            deepest = max(deepest, depth)
        elif token == "]" or token == "}":
            depth -= 1
    return deepest


def _peer(selector: object, weight: object, where: str) -> Peer:
    if not isinstance(selector, str) or "=" not in selector:
        raise InvalidPodError(f"{where}: {shown(selector)} is not a key=value selector")
    key, _, value = selector.strip().partition("=")
    if not LABEL_KEY.fullmatch(key):  # fullmatch: ``$`` alone admits a trailing newline
        raise InvalidPodError(f"{where}: {shown(key)} in {shown(selector)} is not a label key")
    if not value or not LABEL_VALUE.fullmatch(value):
        raise InvalidPodError(f"{where}: {shown(value)} in {shown(selector)} is not a label value")
    number = _weight(weight)
    if not (0.0 < number <= MAX_PEER_WEIGHT):
        limit = f"(0, {MAX_PEER_WEIGHT:g}]"
        shown_weight = repr(weight) if isinstance(weight, _JsonNumber) else shown(weight)
        raise InvalidPodError(f"{where}: weight {shown_weight} of {selector!r} must be a number in {limit}")
    return Peer(key, value, number)


def _weight(weight: object) -> float:
    """A weight's value, or NaN when it is not one: a string (or JSON number) of at most
    :data:`MAX_WEIGHT_CHARS` characters in :data:`_WEIGHT`'s grammar. ``float`` of such a string never
    raises; past the float range it is ``inf``, which the caller's range refuses.

    >>> _weight("2.5"), _weight(" 3 "), _weight("1e400")
    (2.5, 3.0, inf)
    >>> [_weight(w) for w in ("1_000", "١٢", "nan", "-1", "9" * 40, [1], True)]
    [nan, nan, nan, nan, nan, nan, nan]
    """
    if not isinstance(weight, str):
        return float("nan")
    text = weight.strip()
    if len(text) > MAX_WEIGHT_CHARS or not _WEIGHT.fullmatch(text):
        return float("nan")
    return float(text)


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
        The value is not such a list (of at most :data:`MAX_ASSIGNED_GPUS_CHARS` characters, each
        number at most 4 ASCII digits), or a milli amount is not in 1..1000.

    >>> parse_assigned_gpus("0:500, 3:1000")
    ((0, 500), (3, 1000))
    >>> format_assigned_gpus(((3, 250), (1, 250)))
    '1:250,3:250'
    """
    where = f"annotation {ASSIGNED_GPUS_ANNOTATION}={shown(value)}"
    if not isinstance(value, str) or not value.strip():
        raise InvalidPodError(f"{where}: expected index:milli pairs such as '0:500'")
    if len(value) > MAX_ASSIGNED_GPUS_CHARS:
        raise InvalidPodError(f"{where}: {len(value)} characters; at most {MAX_ASSIGNED_GPUS_CHARS}")
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


GPU_UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""How NVML writes a GPU's UUID (``nvmlDeviceGetUUID``): the only shape a reservation pod may report."""


def gpu_uuid(value: object) -> str | None:
    """``value`` if it is a GPU UUID (:data:`GPU_UUID`), else None: ``all``, a list or an index is not one.

    >>> gpu_uuid("GPU-8a1b2c3d-0000-1111-2222-333344445555"), gpu_uuid("all"), gpu_uuid("GPU-8A1B")
    ('GPU-8a1b2c3d-0000-1111-2222-333344445555', None, None)
    """
    return value if isinstance(value, str) and GPU_UUID.fullmatch(value) else None


_PAIR = "[0-9]{1,4}:[0-9]{1,4}"
BIND_ANNOTATION_SHAPES = {
    ASSIGNED_GPUS_ANNOTATION: f"^{_PAIR}(,{_PAIR})*$",
    VISIBLE_DEVICES_ANNOTATION: f"^{GPU_UUID.pattern}$",
    GPU_PORTION_ANNOTATION: "^0[.][0-9]{1,3}$",
    MPS_THREADS_ANNOTATION: "^[0-9]{1,3}$",
    MPS_MEMORY_ANNOTATION: "^0=[0-9]{1,9}MB$",
    CDI_DEVICE_ANNOTATION: f"^{CDI_DEVICE_KIND.replace('.', '[.]')}={GPU_UUID.pattern}$",
}
"""The one shape of each value the bind writes (RE2, as CEL's ``matches`` reads it, without a backslash):
checked before the bind writes them (:func:`bind_annotation_problems`) and by the admission policy on every
Binding that carries them."""


def bind_annotation_problems(annotations: Mapping[str, str]) -> list[str]:
    """What is wrong with the bind's annotations in ``annotations`` (the others are not looked at).

    >>> bind_annotation_problems({"gpu-scheduler.io/visible-devices": "all", "gpu-scheduler.io/gpu-portion": "0.25"})
    ["gpu-scheduler.io/visible-devices: 'all' is not of the bind's shape"]
    """
    return [
        f"{key}: {shown(annotations[key])} is not of the bind's shape"
        for key, pattern in BIND_ANNOTATION_SHAPES.items()
        if key in annotations and not (isinstance(annotations[key], str) and re.fullmatch(pattern, annotations[key]))
    ]


def format_assigned_gpus(pairs: Iterable[tuple[int, int]]) -> str:
    """Canonical annotation text: pairs sorted by GPU index."""
    return ",".join(f"{index}:{milli}" for index, milli in sorted(pairs))
