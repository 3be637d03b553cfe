"""How the API double (:mod:`testing.kube_double`) reads a request: the route its path names, its label
and field selectors, its query's numbers and ``continue`` tokens, its JSON body; and :class:`ApiError`,
the v1 ``Status`` a failure is answered with."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

POD_FIELDS = ("metadata.name", "metadata.namespace", "spec.nodeName", "status.phase", "spec.schedulerName")
NODE_FIELDS = ("metadata.name", "spec.unschedulable")


class ApiError(Exception):
    """A failure answered with a v1 ``Status`` body."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
        body |= {"message": self.message, "reason": self.reason}
        if self.details is not None:
            body["details"] = self.details
        return body | {"code": self.code}


# ---- routing ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Route:
    """What a request's path names: the resource kind, its namespace and name (None for a list), whether it
    is a pod's ``binding``, and the API version."""

    kind: str
    namespace: str | None
    name: str | None
    binding: bool
    version: str = "v1"
    eviction: bool = False


VERBS = {
    ("GET", True): "list",
    ("POST", True): "create",
    ("GET", False): "get",
    ("PATCH", False): "patch",
    ("PUT", False): "update",
    ("DELETE", False): "delete",
    ("POST", False): "create",
}
"""RBAC's verb for a method on a list (True) or on one object (False), as the anonymous user's 403 names it."""
ROUTES = (
    (re.compile(r"^/api/v1/nodes$"), "nodes"),
    (re.compile(r"^/api/v1/nodes/(?P<name>[^/]+)$"), "nodes"),
    (re.compile(r"^/api/v1/pods$"), "pods"),
    (re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods$"), "pods"),
    (re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)(?P<binding>/binding)?$"), "pods"),
    (re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)(?P<eviction>/eviction)$"), "pods"),
    (re.compile(r"^/apis/policy/v1/poddisruptionbudgets$"), "poddisruptionbudgets"),
    (re.compile(r"^/apis/resource\.k8s\.io$"), "resource.k8s.io"),
    (re.compile(r"^/apis/apps/v1/namespaces/(?P<ns>[^/]+)/deployments/(?P<name>[^/]+)$"), "deployments"),
    *(
        (re.compile(rf"^/apis/resource\.k8s\.io/(?P<version>v1\w*)/{kind}$"), kind)
        for kind in ("deviceclasses", "resourceslices", "resourceclaims")
    ),
)
"""Each path the double serves, and the resource kind it names."""


def parse_route(method: str, path: str) -> Route:
    """The route ``path`` names; 404 ``NotFound`` for any path the double does not serve."""
    for pattern, kind in ROUTES:
        match = pattern.match(path)
        if match:
            groups = match.groupdict()
            return Route(
                kind, groups.get("ns"), groups.get("name"), bool(groups.get("binding")), groups.get("version") or "v1",
                bool(groups.get("eviction")),
            )  # fmt: skip
    raise ApiError(404, "NotFound", "the server could not find the requested resource", {})


# ---- selectors -------------------------------------------------------------------------------
Predicate = Callable[[Mapping[str, Any]], bool]


def parse_label_selector(text: str) -> Predicate:
    """Compile a label selector; a malformed one is a 400 ``BadRequest`` as on the real server.

    >>> match = parse_label_selector("gpu.nvidia.com/model in (A100,H100),zone=a,!spot")
    >>> match({"metadata": {"labels": {"gpu.nvidia.com/model": "A100", "zone": "a"}}})
    True
    """
    requirements: list[tuple[str, str, frozenset[str]]] = []  # (key, operator, values)
    for term in _split_terms(text):
        match = re.fullmatch(r"\s*(\S+?)\s+(in|notin)\s+\(([^)]*)\)\s*", term)
        if match:
            values = frozenset(v.strip() for v in match.group(3).split(","))
            requirements.append((match.group(1), match.group(2), values))
            continue
        match = re.fullmatch(r"\s*([^=!\s]+)\s*(==|=|!=)\s*([^=!\s]*)\s*", term)
        if match:
            key, op, value = match.groups()
            requirements.append((key, "notin" if op == "!=" else "in", frozenset([value])))
            continue
        match = re.fullmatch(r"\s*(!?)\s*([^=!\s(),]+)\s*", term)
        if match:
            requirements.append((match.group(2), "!" if match.group(1) else "exists", frozenset()))
            continue
        raise ApiError(400, "BadRequest", f"unable to parse requirement: {term.strip()!r}")

    def predicate(obj: Mapping[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        for key, op, values in requirements:
            if op == "exists":
                ok = key in labels
            elif op == "!":
                ok = key not in labels
            else:
                ok = (labels.get(key) in values) == (op == "in")
            if not ok:
                return False
        return True

    return predicate


def parse_field_selector(text: str, kind: str) -> Predicate:
    """Compile a field selector over the fields the API supports for ``kind``."""
    supported = POD_FIELDS if kind == "pods" else NODE_FIELDS
    tests: list[tuple[str, bool, str]] = []
    for term in filter(None, (t.strip() for t in text.split(","))):
        match = re.fullmatch(r"([A-Za-z.]+)\s*(==|=|!=)\s*(.*)", term)
        if not match:
            raise ApiError(400, "BadRequest", f"invalid selector: {term!r}; can't understand {term!r}")
        name, op, value = match.groups()
        if name not in supported:
            raise ApiError(400, "BadRequest", f"field label not supported: {name}")
        tests.append((name, op == "!=", value))

    def predicate(obj: Mapping[str, Any]) -> bool:
        for name, negate, value in tests:
            section, _, leaf = name.partition(".")
            have = (obj.get(section) or {}).get(leaf)
            have = "" if have is None else str(have).lower() if isinstance(have, bool) else str(have)
            if (have == value) == negate:
                return False
        return True

    return predicate


def _split_terms(text: str) -> list[str]:
    terms: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "," and depth == 0:
            terms.append("".join(current))
            current = []
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        current.append(char)
    terms.append("".join(current))
    return [t for t in terms if t.strip()]


# ---- bodies and query parameters -------------------------------------------------------------
def decode_body(body: bytes) -> Any:
    try:
        return json.loads(body or b"null")
    except ValueError as exc:
        raise ApiError(400, "BadRequest", f"the request body is not JSON: {exc}") from exc


def int_param(query: Mapping[str, str], name: str) -> int:
    raw = query.get(name, "0") or "0"
    if not raw.isdigit():
        raise ApiError(400, "BadRequest", f"{name}: expected a non-negative integer, got {raw!r}")
    return int(raw)


def encode_continue(rv: int, start: str) -> str:
    token = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start}, separators=(",", ":"))
    return base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, str]:
    try:
        decoded = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        return int(decoded["rv"]), str(decoded["start"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ApiError(400, "BadRequest", f"continue key is not valid: {exc}") from exc
