"""kube-scheduler extender v1 wire types (``k8s.io/kube-scheduler/extender/v1``).

The Go structs have no json tags, so keys are the Go field names (``Pod``, ``NodeNames``...). Go's
decoder matches keys case-insensitively, preferring an exact match, and so does :func:`_field`.
Missing lists and maps arrive as ``null``. The embedded ``Pod`` and ``Node`` objects are ordinary
Kubernetes objects with camelCase keys; they are kept as parsed JSON and read by
:mod:`scheduler_core.k8s.pods` and :mod:`scheduler_core.k8s.nodes`.

The requests are typed here. Each reply has one writer, the decision that carries it:
``FilterOutcome.to_json`` and ``PrioritizeOutcome.to_json`` (:mod:`scheduler_core.extender.decide`,
written directly: they are large), ``BindOutcome.to_json`` and ``PreemptOutcome.to_wire``. The JSON
codecs they share are here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from scheduler_core.errors import InvalidArgsError

WireObject = dict[str, Any]


def decode_json(body: bytes) -> Any:
    """Parse a request body; any failure is an :class:`InvalidArgsError` naming the problem.

    >>> decode_json(b'{"Pod": ')
    Traceback (most recent call last):
    ...
    scheduler_core.errors.InvalidArgsError: request body is not valid JSON: Expecting value: line 1 column 9 (char 8)
    """
    try:
        return json.loads(body)
    except RecursionError as exc:
        raise InvalidArgsError("request body is nested too deeply to be an extender request") from exc
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise InvalidArgsError(f"request body is not valid JSON: {exc}") from exc


def encode_json(obj: Any) -> bytes:
    """Compact JSON, as kube-scheduler's Go client reads it."""
    return json.dumps(obj, separators=(",", ":")).encode()


def error_body(message: str) -> bytes:
    """``{"Error": message}``: the body of every refusal."""
    return encode_json({"Error": message})


STATUS: Mapping[str, int] = {
    "": 200,  # a decision; filter and bind report a pod's own problem as its Error in a 200
    "bad_request": 400,  # a body that does not parse or has the wrong shape
    "invalid_pod": 400,  # prioritize and preempt: a pod whose GPU request cannot be read
    "too_large": 400,  # a body over the limit
    "transport": 400,  # a request the transport cannot hand over (no Content-Length, bad base64, no API event)
    "unknown_verb": 404,  # a verb this extender does not serve
    "no_route": 404,  # a path that is no route
    "internal": 500,  # a fault, logged with its traceback, never shown
    "unavailable": 503,  # no usable cluster state (prioritize, preempt, /healthz), or too many connections
}
"""The one table from how a call ends to its HTTP status (DESIGN section 4), for the facade, the extender
service and both transports."""


json_string: Callable[[str], str] = json.encoder.encode_basestring_ascii
"""The C string encoder behind ``json.dumps``: escapes and quotes one string."""


def _field(obj: Mapping[str, Any], key: str) -> Any:
    """Go ``encoding/json`` field lookup: exact key first, then any case-insensitive match."""
    if key in obj:
        return obj[key]
    folded = key.casefold()
    for name, value in obj.items():
        if isinstance(name, str) and name.casefold() == folded:
            return value
    return None


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidArgsError(f"{where}: expected a JSON object, got {_kind(value)}")
    return value


def _optional_list(value: Any, where: str) -> list[Any] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise InvalidArgsError(f"{where}: expected a list or null, got {_kind(value)}")
    return value


def _string(value: Any, where: str, *, required: bool = True) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise InvalidArgsError(f"{where}: expected a non-empty string, got {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    return f"{type(value).__name__} {value!r}"


@dataclass(frozen=True)
class ExtenderArgs:
    """Body of ``filter`` and ``prioritize``.

    Exactly one node form is set: ``nodes`` (``nodeCacheCapable: false``, a NodeList's items) or
    ``node_names`` (``nodeCacheCapable: true``).
    """

    pod: Mapping[str, Any]
    nodes: list[Any] | None = None
    node_names: list[str] | None = None

    @property
    def names_only(self) -> bool:
        return self.nodes is None

    @classmethod
    def from_wire(cls, obj: Any) -> ExtenderArgs:
        """Validate the decoded JSON body.

        >>> ExtenderArgs.from_wire({"pod": {}, "nodenames": ["a"], "Nodes": None}).node_names
        ['a']
        """
        body = _object(obj, "request body")
        pod = _field(body, "Pod")
        if pod is None:
            raise InvalidArgsError("Pod: required, got null or nothing")
        pod = _object(pod, "Pod")
        raw_nodes = _field(body, "Nodes")
        nodes = None
        if raw_nodes is not None:
            items = _object(raw_nodes, "Nodes").get("items")
            nodes = _optional_list(items, "Nodes.items") or []
        names = _optional_list(_field(body, "NodeNames"), "NodeNames")
        if names is not None and not set(map(type, names)) <= {str}:
            raise InvalidArgsError("NodeNames: expected a list of strings")
        if nodes is None and names is None:
            raise InvalidArgsError("Nodes and NodeNames are both null; one of them must carry the candidate nodes")
        if nodes is not None and names is not None:
            names = None  # kube-scheduler sends one form; with both, the full objects are authoritative.
        return cls(pod=pod, nodes=nodes, node_names=names)

    @classmethod
    def decode(cls, body: bytes) -> ExtenderArgs:
        """:meth:`from_wire` of the raw body. The names form exactly as kube-scheduler writes it (the Go
        field names, ``Nodes`` null) is decoded and checked in one pass by msgspec, with no Python work
        per name (a third of ``json.loads``'s time at 10,000 names); any other body, valid or not, takes
        the general path, which gives every error its message.

        >>> ExtenderArgs.decode(b'{"Pod":{},"Nodes":null,"NodeNames":["a"]}').node_names
        ['a']
        >>> ExtenderArgs.decode(b'{"Pod":{},"NodeNames":["a", 1]}')
        Traceback (most recent call last):
        ...
        scheduler_core.errors.InvalidArgsError: NodeNames: expected a list of strings
        """
        try:
            fast = _NAMES_FORM.decode(body)
        except (ValueError, RecursionError):  # msgspec's errors, and invalid UTF-8, are ValueErrors
            return cls.from_wire(decode_json(body))
        return cls(pod=fast.Pod, node_names=fast.NodeNames)


class _NamesForm(msgspec.Struct, forbid_unknown_fields=True):
    """The names form of ``ExtenderArgs`` with its exact Go keys; any other key, a key in another case,
    or a value of another type fails, and :meth:`ExtenderArgs.decode` then takes the general path."""

    Pod: dict[str, Any]
    NodeNames: list[str]
    Nodes: None = None


_NAMES_FORM = msgspec.json.Decoder(_NamesForm)


@dataclass(frozen=True)
class ExtenderBindingArgs:
    """Body of ``bind``."""

    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str

    @classmethod
    def from_wire(cls, obj: Any) -> ExtenderBindingArgs:
        body = _object(obj, "request body")
        return cls(
            pod_name=_string(_field(body, "PodName"), "PodName"),
            pod_namespace=_string(_field(body, "PodNamespace"), "PodNamespace"),
            pod_uid=_string(_field(body, "PodUID"), "PodUID"),
            node=_string(_field(body, "Node"), "Node"),
        )

    def to_wire(self) -> WireObject:
        return {"PodName": self.pod_name, "PodNamespace": self.pod_namespace, "PodUID": self.pod_uid, "Node": self.node}


@dataclass(frozen=True)
class MetaVictims:
    """Victims on one node by UID (``nodeCacheCapable: true``), or the reply's form."""

    uids: tuple[str, ...]
    num_pdb_violations: int = 0

    def to_wire(self) -> WireObject:
        return {"Pods": [{"UID": uid} for uid in self.uids], "NumPDBViolations": self.num_pdb_violations}


@dataclass(frozen=True)
class Victims:
    """Victims on one node as full Pod objects (``nodeCacheCapable: false``)."""

    pods: tuple[Mapping[str, Any], ...]
    num_pdb_violations: int = 0

    def to_meta(self) -> MetaVictims:
        uids = []
        for pod in self.pods:
            metadata = pod.get("metadata")
            uids.append(metadata.get("uid", "") if isinstance(metadata, Mapping) else "")
        return MetaVictims(uids=tuple(uids), num_pdb_violations=self.num_pdb_violations)


def _victim_entries(body: Mapping[str, Any], key: str) -> Iterator[tuple[str, str, Mapping[str, Any], list[Any]]]:
    """Each node of the victims map ``key`` as (node, where, entry, its ``Pods``), checked one node at a time."""
    for node, entry in _object(_field(body, key), key).items():
        where = f"{key}[{node!r}]"
        entry = _object(entry, where)
        yield node, where, entry, _optional_list(_field(entry, "Pods"), f"{where}.Pods") or []


def _pdb_violations(entry: Mapping[str, Any], where: str) -> int:
    value = _field(entry, "NumPDBViolations")
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgsError(f"{where}.NumPDBViolations: expected a non-negative integer, got {_kind(value)}")
    return value


@dataclass(frozen=True)
class ExtenderPreemptionArgs:
    """Body of ``preempt``: candidate victims per node, in one of the two forms."""

    pod: Mapping[str, Any]
    node_name_to_victims: Mapping[str, Victims] | None = None
    node_name_to_meta_victims: Mapping[str, MetaVictims] | None = None

    @classmethod
    def from_wire(cls, obj: Any) -> ExtenderPreemptionArgs:
        body = _object(obj, "request body")
        pod = _field(body, "Pod")
        if pod is None:
            raise InvalidArgsError("Pod: required, got null or nothing")
        victims: dict[str, Victims] | None = None
        if _field(body, "NodeNameToVictims") is not None:
            victims = {
                node: Victims(
                    pods=tuple(_object(p, f"{where}.Pods[{i}]") for i, p in enumerate(pods)),
                    num_pdb_violations=_pdb_violations(entry, where),
                )
                for node, where, entry, pods in _victim_entries(body, "NodeNameToVictims")
            }
        meta: dict[str, MetaVictims] | None = None
        if _field(body, "NodeNameToMetaVictims") is not None:
            meta = {
                node: MetaVictims(
                    uids=tuple(
                        _string(_field(_object(p, f"{where}.Pods[{i}]"), "UID"), f"{where}.Pods[{i}].UID")
                        for i, p in enumerate(pods)
                    ),
                    num_pdb_violations=_pdb_violations(entry, where),
                )
                for node, where, entry, pods in _victim_entries(body, "NodeNameToMetaVictims")
            }
        return cls(pod=_object(pod, "Pod"), node_name_to_victims=victims, node_name_to_meta_victims=meta)
