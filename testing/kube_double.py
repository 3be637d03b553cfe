"""An in-repo double of the kube-apiserver's core/v1 nodes and pods API, served over loopback HTTP.

No kube-apiserver can run on these machines (DESIGN section 7), so the refreshers' tests and
benchmarks talk to this instead, through the real ``kubernetes`` client. It reproduces what the
captured responses in ``../shared/fixtures/kube-apiserver/`` show, byte for byte where the
fixtures pin it down (``tests/testing/test_kube_double.py`` checks that):

- lists: compact JSON, items without ``kind``/``apiVersion``, sorted by key (name, or
  ``namespace/name`` for pods across namespaces); ``limit`` and ``continue`` with the server's
  token format (base64url JSON ``{"v","rv","start"}``), ``remainingItemCount`` when the list has no
  selectors, and consistent pages: a continued list is served from the snapshot of its first page.
  A token older than the last few snapshots gets 410 ``Expired``, as after an etcd compaction.
- label selectors (``=``, ``==``, ``!=``, ``in``, ``notin``, exists, ``!``) and the field selectors
  the API supports for pods and nodes;
- GET, PUT (409 ``Conflict`` on a stale ``resourceVersion``), PATCH with
  ``application/merge-patch+json`` or ``application/strategic-merge-patch+json``, DELETE, and POST
  ``pods/NAME/binding`` (201, 409 when already bound, 404; the Binding's annotations are merged onto
  the pod, as the real server does); POST of a pod to its namespace (201 with a UID, 409
  ``AlreadyExists``);
- validation: label keys and values on nodes and pods, and the ``pod-deletion-cost`` annotation
  (422 ``Invalid`` with the server's message and causes);
- authentication: 401 for an unknown bearer token, 403 for ``system:anonymous``;
- fault injection (``fail_next``), for 429/5xx retries, and a request log for assertions;
- with ``dra_api`` (``resource.k8s.io/v1``), DRA's group discovery and cluster-wide lists of
  ``deviceclasses``, ``resourceslices`` and ``resourceclaims`` in that version, loaded with :meth:`load`
  (no scheduler runs here: a claim is loaded as kube-scheduler leaves it, allocation and all); without
  it, ``/apis/resource.k8s.io`` is 404, as on a server that does not serve DRA.
"""

from __future__ import annotations

import base64
import bisect
import copy
import json
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
_KINDS = {"nodes": "Node", "pods": "Pod", "deviceclasses": "DeviceClass", "resourceslices": "ResourceSlice",
          "resourceclaims": "ResourceClaim", "deployments": "Deployment"}  # fmt: skip
_NAMESPACED = ("pods", "resourceclaims", "deployments")
_POD_FIELDS = ("metadata.name", "metadata.namespace", "spec.nodeName", "status.phase", "spec.schedulerName")
_NODE_FIELDS = ("metadata.name", "spec.unschedulable")
_SNAPSHOTS_KEPT = 8
# Strategic merge: the merge key of each list field the double knows; other lists are replaced.
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "conditions": "type",
    "addresses": "type",
    "taints": "key",
    "tolerations": "key",
    "env": "name",
    "ports": "containerPort",
    "volumes": "name",
    "volumeMounts": "mountPath",
}
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


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


def encode(obj: Any) -> bytes:
    """The apiserver's compact JSON, ending in a newline."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


@dataclass
class _Entry:
    obj: dict[str, Any]
    raw: bytes  # the item as it appears in a list (no kind/apiVersion), compact


@dataclass
class _Collection:
    entries: dict[str, _Entry] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)  # sorted


@dataclass
class _Fault:
    method: str
    path: re.Pattern[str]
    code: int
    remaining: int
    retry_after: str | None


@dataclass(frozen=True)
class LoggedRequest:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: bytes
    status: int


class KubeApiDouble:
    """The API state plus an HTTP server for it; use as a context manager.

    Parameters
    ----------
    tokens : bearer tokens accepted; ``None`` accepts any non-empty token.
    authenticate : optional predicate on the token, used instead of ``tokens``.
    reservations_report : a reservation pod (``manifests/reservation.py``) created here reports its
        GPU's UUID at once, a made-up one per node and slot (``testing.reservation_kubelet.gpu_uuid``),
        as the kubelet, the device plugin and the reservation program would on a GPU node; False: it
        stays unreported, as on a node that has not started it.
    """

    def __init__(
        self,
        *,
        tokens: Iterable[str] | None = None,
        authenticate: Callable[[str], bool] | None = None,
        resource_version: int = 1,
        reservations_report: bool = True,
        dra_api: str = "",
    ) -> None:
        self.reservations_report = reservations_report
        self.dra_api = dra_api
        self._tokens = None if tokens is None else set(tokens)
        self._authenticate = authenticate
        self._lock = threading.RLock()
        self._collections = {kind: _Collection() for kind in _KINDS}
        self._rv = resource_version
        self._created = 0  # pods POSTed, for their UIDs
        self._snapshots: OrderedDict[tuple[str, int], tuple[list[str], dict[str, _Entry]]] = OrderedDict()
        self._faults: list[_Fault] = []
        self.requests: list[LoggedRequest] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- state -------------------------------------------------------------------------------
    def load(self, kind: str, objects: Iterable[Mapping[str, Any]]) -> None:
        """Add objects as they are, keeping their ``resourceVersion`` (fixtures) or assigning one."""
        collection = self._collections[kind]
        with self._lock:
            for source in objects:
                obj = copy.deepcopy(dict(source))
                obj.pop("kind", None)
                obj.pop("apiVersion", None)
                metadata = obj.setdefault("metadata", {})
                if kind in _NAMESPACED:
                    metadata.setdefault("namespace", "default")
                if "resourceVersion" in metadata:
                    self._rv = max(self._rv, int(metadata["resourceVersion"]))
                else:
                    self._rv += 1
                    metadata["resourceVersion"] = str(self._rv)
                key = self._key(kind, metadata.get("namespace"), metadata["name"])
                if key not in collection.entries:
                    collection.keys.append(key)
                collection.entries[key] = _Entry(obj, _raw(obj))
            collection.keys.sort()

    @property
    def resource_version(self) -> int:
        return self._rv

    def set_resource_version(self, rv: int) -> None:
        with self._lock:
            self._rv = rv

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        """A deep copy of an object (for assertions); KeyError when absent."""
        with self._lock:
            return copy.deepcopy(self._collections[kind].entries[self._key(kind, namespace, name)].obj)

    def objects(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            collection = self._collections[kind]
            return [copy.deepcopy(collection.entries[key].obj) for key in collection.keys]

    def fail_next(
        self, method: str, path_pattern: str, code: int, *, times: int = 1, retry_after: str | None = None
    ) -> None:
        """Answer the next ``times`` requests matching ``method`` and ``path_pattern`` with ``code``.

        The pattern is searched in ``path?query``, so ``continue=`` can single out later list pages.
        """
        with self._lock:
            self._faults.append(_Fault(method.upper(), re.compile(path_pattern), code, times, retry_after))

    def writes(self) -> list[LoggedRequest]:
        return [r for r in self.requests if r.method in ("PATCH", "PUT", "POST", "DELETE")]

    @staticmethod
    def _key(kind: str, namespace: str | None, name: str) -> str:
        return f"{namespace}/{name}" if kind in _NAMESPACED else name

    # ---- server ------------------------------------------------------------------------------
    def __enter__(self) -> KubeApiDouble:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        server = ThreadingHTTPServer((host, port), _Handler)
        server.daemon_threads = True
        server.api = self  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        assert self._server is not None, "the double is not started"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    # ---- request dispatch --------------------------------------------------------------------
    def handle(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, bytes, dict[str, str]]:
        parts = urlsplit(target)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        path = parts.path.rstrip("/")
        content_type = headers.get("Content-Type", "").split(";")[0].strip()
        extra: dict[str, str] = {}
        try:
            route = _route(method, path)
            self._check_auth(headers.get("Authorization"), method, route)
            fault = self._take_fault(method, f"{path}?{parts.query}" if parts.query else path)
            if fault is not None:
                if fault.retry_after is not None:
                    extra["Retry-After"] = fault.retry_after
                raise _fault_error(fault.code)
            status, payload = self._dispatch(method, route, query, content_type, body)
        except ApiError as exc:
            status, payload = exc.code, encode(exc.status())
        with self._lock:
            self.requests.append(LoggedRequest(method, path, query, content_type, body, status))
        return status, payload, extra

    def _take_fault(self, method: str, target: str) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.remaining > 0 and fault.method == method and fault.path.search(target):
                    fault.remaining -= 1
                    return fault
        return None

    def _check_auth(self, header: str | None, method: str, route: _Route) -> None:
        token = header[len("Bearer") :].strip() if header and header.startswith("Bearer") else ""
        if not token:
            verb = _VERBS.get((method, route.name is None), "get")
            resource = route.kind + ("/binding" if route.binding else "")
            where = f'in the namespace "{route.namespace}"' if route.namespace else "at the cluster scope"
            raise ApiError(
                403,
                "Forbidden",
                f'{resource} is forbidden: User "system:anonymous" cannot {verb} resource "{resource}"'
                f' in API group "" {where}',
                {"kind": resource} if route.name is None else {"name": route.name, "kind": resource},
            )
        accepted = (
            self._authenticate(token)
            if self._authenticate is not None
            else (self._tokens is None or token in self._tokens)
        )
        if not accepted:
            raise ApiError(401, "Unauthorized", "Unauthorized")

    def _dispatch(
        self, method: str, route: _Route, query: Mapping[str, str], content_type: str, body: bytes
    ) -> tuple[int, bytes]:
        if route.kind == "resource.k8s.io":
            return 200, self._dra_group(method)
        if route.kind == "deployments":
            if method != "GET":
                raise ApiError(405, "MethodNotAllowed", "the double serves Deployments read-only (load them)")
        elif route.kind not in ("nodes", "pods"):
            if not self.dra_api or route.version != self.dra_api.rpartition("/")[2]:
                raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
            if method != "GET":
                raise ApiError(405, "MethodNotAllowed", "the double serves DRA's objects read-only (load them)")
        if route.binding:
            if method != "POST":
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on pods/binding")
            return 201, self._bind(route, _decode(body))
        if route.name is None:
            if method == "POST" and route.kind == "pods" and route.namespace:
                return 201, self._create(route, _decode(body))
            if method != "GET":
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the list")
            return 200, self._list(route, query)
        if method == "GET":
            with self._lock:
                return 200, _with_kind(route.kind, self._entry(route).obj)
        if method == "PATCH":
            return 200, self._patch(route, content_type, _decode(body))
        if method == "PUT":
            return 200, self._put(route, _decode(body))
        if method == "DELETE":
            with self._lock:
                entry = self._entry(route)
                self._remove(route)
                return 200, _with_kind(route.kind, entry.obj)
        raise ApiError(405, "MethodNotAllowed", f"the server does not allow the {method} method")

    def _dra_group(self, method: str) -> bytes:
        if not self.dra_api or method != "GET":
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        version = self.dra_api.rpartition("/")[2]
        entry = {"groupVersion": self.dra_api, "version": version}
        return encode({"kind": "APIGroup", "apiVersion": "v1", "name": "resource.k8s.io", "versions": [entry],
                       "preferredVersion": entry})  # fmt: skip

    # ---- lists -------------------------------------------------------------------------------
    def _list(self, route: _Route, query: Mapping[str, str]) -> bytes:
        labels = parse_label_selector(query.get("labelSelector", ""))
        fields = parse_field_selector(query.get("fieldSelector", ""), route.kind)
        limit = _int_param(query, "limit")
        token = query.get("continue", "")
        prefix = f"{route.namespace}/" if route.namespace else ""
        with self._lock:
            if token:
                rv, start = _decode_continue(token)
                snapshot = self._snapshots.get((route.kind, rv))
                if snapshot is None:
                    raise ApiError(
                        410,
                        "Expired",
                        "The provided continue parameter is too old to display a consistent list result. You"
                        " can start a new list without the continue parameter, or use the continue token in"
                        " this response to retrieve the remainder of the results. Continuing with the provided"
                        " token results in an inconsistent list - objects that were created, modified, or"
                        " deleted between the time the first chunk was returned and now may show up in the list.",
                    )
                keys, entries = snapshot
                position = bisect.bisect_left(keys, prefix + start)
            else:
                rv = self._rv
                collection = self._collections[route.kind]
                keys, entries = collection.keys, collection.entries
                position = bisect.bisect_left(keys, prefix)
                if limit:
                    # Later pages are served from this snapshot, like etcd's MVCC read at rv.
                    keys, entries = list(keys), dict(entries)
                    self._snapshots[(route.kind, rv)] = (keys, entries)
                    while len(self._snapshots) > _SNAPSHOTS_KEPT:
                        self._snapshots.popitem(last=False)
        items: list[bytes] = []
        last_key = ""
        more = False
        end = len(keys)
        while position < end:
            key = keys[position]
            if not key.startswith(prefix):
                break
            entry = entries[key]
            position += 1
            if not (labels(entry.obj) and fields(entry.obj)):
                continue
            if limit and len(items) == limit:
                more = True
                position -= 1
                break
            items.append(entry.raw)
            last_key = key
        metadata: dict[str, Any] = {"resourceVersion": str(rv)}
        if more:
            start = last_key[len(prefix) :] + "\x00"
            metadata["continue"] = _encode_continue(rv, start)
            if not query.get("labelSelector") and not query.get("fieldSelector"):
                remaining = bisect.bisect_left(keys, prefix + "\U0010ffff") - position
                metadata["remainingItemCount"] = remaining
        api = "v1" if route.kind in ("nodes", "pods") else self.dra_api
        head = encode({"kind": f"{_KINDS[route.kind]}List", "apiVersion": api, "metadata": metadata})
        return head[:-2] + b',"items":[' + b",".join(items) + b"]}\n"

    # ---- writes ------------------------------------------------------------------------------
    def _entry(self, route: _Route) -> _Entry:
        assert route.name is not None
        entry = self._collections[route.kind].entries.get(self._key(route.kind, route.namespace, route.name))
        if entry is None:
            raise ApiError(
                404, "NotFound", f'{route.kind} "{route.name}" not found', {"name": route.name, "kind": route.kind}
            )
        return entry

    def _store(self, route: _Route, obj: dict[str, Any]) -> bytes:
        assert route.name is not None
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        collection = self._collections[route.kind]
        key = self._key(route.kind, route.namespace, route.name)
        if key not in collection.entries:
            bisect.insort(collection.keys, key)
        collection.entries[key] = _Entry(obj, _raw(obj))
        return _with_kind(route.kind, obj)

    def _create(self, route: _Route, obj: Any) -> bytes:
        """POST a pod to its namespace: 201 with its UID, or 409 ``AlreadyExists`` for a name in use."""
        name = (obj.get("metadata") or {}).get("name") if isinstance(obj, dict) else None
        if not isinstance(name, str) or not name:
            raise ApiError(422, "Invalid", "Pod is invalid: metadata.name: Required value: name is required")
        named = _Route(route.kind, route.namespace, name, False)
        with self._lock:
            if self._key(route.kind, route.namespace, name) in self._collections[route.kind].entries:
                raise ApiError(409, "AlreadyExists", f'pods "{name}" already exists', {"name": name, "kind": "pods"})
            self._validate(named, obj)
            self._created += 1
            obj["metadata"].update(
                namespace=route.namespace,
                uid=f"00000000-0000-4000-8000-{self._created:012d}",
                creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            )
            obj.setdefault("status", {}).setdefault("phase", "Pending")
            if self.reservations_report:
                _report_reservation(obj)
            return self._store(named, obj)

    def _remove(self, route: _Route) -> None:
        assert route.name is not None
        collection = self._collections[route.kind]
        key = self._key(route.kind, route.namespace, route.name)
        del collection.entries[key]
        collection.keys.pop(bisect.bisect_left(collection.keys, key))
        self._rv += 1

    def _patch(self, route: _Route, content_type: str, patch: Any) -> bytes:
        if content_type not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types include:"
                f" application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml,"
                f" application/strategic-merge-patch+json (got {content_type!r})",
            )
        if not isinstance(patch, dict):
            raise ApiError(400, "BadRequest", "the patch body must be a JSON object")
        strategic = content_type == "application/strategic-merge-patch+json"
        with self._lock:
            current = self._entry(route).obj
            wanted_rv = (patch.get("metadata") or {}).get("resourceVersion")
            if wanted_rv is not None and wanted_rv != current["metadata"]["resourceVersion"]:
                raise _conflict(route)
            updated = merge_patch(current, patch, strategic=strategic)
            self._validate(route, updated)
            return self._store(route, updated)

    def _put(self, route: _Route, body: Any) -> bytes:
        if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
            raise ApiError(400, "BadRequest", "the body must be a v1 object with metadata")
        with self._lock:
            current = self._entry(route).obj
            if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                raise _conflict(route)
            updated = copy.deepcopy(body)
            updated.pop("kind", None)
            updated.pop("apiVersion", None)
            self._validate(route, updated)
            return self._store(route, updated)

    def _bind(self, route: _Route, binding: Any) -> bytes:
        target = binding.get("target") if isinstance(binding, dict) else None
        node = target.get("name") if isinstance(target, dict) else None
        if not isinstance(node, str) or not node:
            raise ApiError(400, "BadRequest", "Binding.target.name is required")
        pod_route = _Route("pods", route.namespace, route.name, False)
        with self._lock:
            pod = copy.deepcopy(self._entry(pod_route).obj)
            bound = pod.get("spec", {}).get("nodeName")
            if bound:
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on pods/binding "{route.name}": pod {route.name} is already'
                    f' assigned to node "{bound}"',
                    {"name": route.name, "kind": "pods/binding"},
                )
            pod.setdefault("spec", {})["nodeName"] = node
            # As the real binding registry does: the Binding's annotations are merged onto the pod.
            extra = (binding.get("metadata") or {}).get("annotations") or {}
            if extra:
                pod.setdefault("metadata", {}).setdefault("annotations", {}).update(extra)
            conditions = pod.setdefault("status", {}).setdefault("conditions", [])
            conditions[:] = [c for c in conditions if c.get("type") != "PodScheduled"]
            conditions.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None})
            self._store(pod_route, pod)
        return encode({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})

    def _validate(self, route: _Route, obj: Mapping[str, Any]) -> None:
        metadata = obj.get("metadata") or {}
        kind = _KINDS[route.kind]
        causes: list[dict[str, str]] = []
        for key, value in (metadata.get("labels") or {}).items():
            problem = _label_problem(key, value)
            if problem:
                causes.append({"reason": "FieldValueInvalid", "message": problem, "field": "metadata.labels"})
        if route.kind == "pods":
            cost = (metadata.get("annotations") or {}).get(DELETION_COST)
            if cost is not None and not _valid_deletion_cost(cost):
                cause = {
                    "reason": "FieldValueInvalid",
                    "message": f"Invalid value: {json.dumps(cost)}: must be a 32bit integer",
                    "field": f"metadata.annotations[{DELETION_COST}]",
                }
                # The real server reports this cause twice (fixture b5b): once from metadata, once from spec.
                causes += [cause, dict(cause)]
        if causes:
            summary = "; ".join(f"{c['field']}: {c['message']}" for c in causes[:1])
            raise ApiError(
                422,
                "Invalid",
                f'{kind} "{route.name}" is invalid: {summary}',
                {"name": route.name, "kind": kind, "causes": causes},
            )


# ---- routing ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Route:
    kind: str
    namespace: str | None
    name: str | None
    binding: bool
    version: str = "v1"


_VERBS = {
    ("GET", True): "list",
    ("POST", True): "create",
    ("GET", False): "get",
    ("PATCH", False): "patch",
    ("PUT", False): "update",
    ("DELETE", False): "delete",
    ("POST", False): "create",
}
_ROUTES = (
    (re.compile(r"^/api/v1/nodes$"), "nodes"),
    (re.compile(r"^/api/v1/nodes/(?P<name>[^/]+)$"), "nodes"),
    (re.compile(r"^/api/v1/pods$"), "pods"),
    (re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods$"), "pods"),
    (re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)(?P<binding>/binding)?$"), "pods"),
    (re.compile(r"^/apis/resource\.k8s\.io$"), "resource.k8s.io"),
    (re.compile(r"^/apis/apps/v1/namespaces/(?P<ns>[^/]+)/deployments/(?P<name>[^/]+)$"), "deployments"),
    *(
        (re.compile(rf"^/apis/resource\.k8s\.io/(?P<version>v1\w*)/{kind}$"), kind)
        for kind in ("deviceclasses", "resourceslices", "resourceclaims")
    ),
)


def _report_reservation(pod: dict[str, Any]) -> None:
    """What a GPU node does with a reservation pod bound to it: Running, its GPU's UUID reported."""
    from scheduler_core.k8s.names import RESERVED_GPU_ANNOTATION
    from scheduler_core.state.allocation import reservation_of
    from testing.reservation_kubelet import gpu_uuid

    slot = reservation_of(pod)
    if slot is not None:
        pod["metadata"].setdefault("annotations", {})[RESERVED_GPU_ANNOTATION] = gpu_uuid(*slot)
        pod["status"]["phase"] = "Running"


def _route(method: str, path: str) -> _Route:
    for pattern, kind in _ROUTES:
        match = pattern.match(path)
        if match:
            groups = match.groupdict()
            return _Route(
                kind, groups.get("ns"), groups.get("name"), bool(groups.get("binding")), groups.get("version") or "v1"
            )
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
    supported = _POD_FIELDS if kind == "pods" else _NODE_FIELDS
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


# ---- patching --------------------------------------------------------------------------------
def merge_patch(target: Any, patch: Any, *, strategic: bool = False) -> Any:
    """RFC 7386 merge patch (``null`` deletes); with ``strategic``, lists with a known merge key merge
    item by item, as the apiserver's strategic merge does for those fields."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif strategic and key in _MERGE_KEYS and isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(result[key], value, _MERGE_KEYS[key])
        else:
            result[key] = merge_patch(result.get(key), value, strategic=strategic)
    return result


def _merge_list(current: list[Any], patch: list[Any], merge_key: str) -> list[Any]:
    merged = copy.deepcopy(current)
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            merged.append(copy.deepcopy(item))
            continue
        for i, existing in enumerate(merged):
            if isinstance(existing, dict) and existing.get(merge_key) == item[merge_key]:
                if item.get("$patch") == "delete":
                    merged.pop(i)
                else:
                    merged[i] = merge_patch(existing, item, strategic=True)
                break
        else:
            if item.get("$patch") != "delete":
                merged.append(copy.deepcopy(item))
    return merged


# ---- helpers ---------------------------------------------------------------------------------
def _raw(obj: Mapping[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _with_kind(kind: str, obj: Mapping[str, Any]) -> bytes:
    return encode({"kind": _KINDS[kind], "apiVersion": "apps/v1" if kind == "deployments" else "v1", **obj})


def _decode(body: bytes) -> Any:
    try:
        return json.loads(body or b"null")
    except ValueError as exc:
        raise ApiError(400, "BadRequest", f"the request body is not JSON: {exc}") from exc


def _int_param(query: Mapping[str, str], name: str) -> int:
    raw = query.get(name, "0") or "0"
    if not raw.isdigit():
        raise ApiError(400, "BadRequest", f"{name}: expected a non-negative integer, got {raw!r}")
    return int(raw)


def _encode_continue(rv: int, start: str) -> str:
    token = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start}, separators=(",", ":"))
    return base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[int, str]:
    try:
        decoded = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        return int(decoded["rv"]), str(decoded["start"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ApiError(400, "BadRequest", f"continue key is not valid: {exc}") from exc


def _conflict(route: _Route) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {route.kind} "{route.name}": the object has been modified; please apply'
        " your changes to the latest version and try again",
        {"name": route.name, "kind": route.kind},
    )


def _fault_error(code: int) -> ApiError:
    reasons = {409: "Conflict", 410: "Expired", 429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}
    return ApiError(code, reasons.get(code, HTTPStatus(code).phrase.replace(" ", "")), f"injected fault {code}", {})


def _label_problem(key: object, value: object) -> str:
    if not isinstance(key, str) or not isinstance(value, str):
        return f"label {key!r}: keys and values must be strings"
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return f"Invalid value: {json.dumps(key)}: prefix part must be a DNS-1123 subdomain"
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        return f"Invalid value: {json.dumps(key)}: name part must consist of alphanumeric characters"
    if len(value) > 63 or not _LABEL_NAME.match(value):
        return (
            f"Invalid value: {json.dumps(value)}: a valid label must be an empty string or consist of alphanumeric"
            " characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        )
    return ""


def _valid_deletion_cost(value: object) -> bool:
    # apimachinery: the first character must be a digit or '-', then strconv.ParseInt(value, 10, 32).
    if not isinstance(value, str) or not re.fullmatch(r"-?[0-9]+", value):
        return False
    return -(2**31) <= int(value) < 2**31


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    timeout = 60

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        api: KubeApiDouble = self.server.api  # type: ignore[attr-defined]
        # self.headers looks names up case-insensitively, as HTTP requires (client-go sends "authorization").
        status, payload, extra = api.handle(self.command, self.path, self.headers, body)  # type: ignore[arg-type]
        head = f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in extra.items())
        head += f"Content-Length: {len(payload)}\r\n\r\n"
        self.wfile.write(head.encode("latin-1") + payload)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve  # noqa: N815 - names fixed by the base class

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature fixed by the base class
        pass


def main(argv: list[str] | None = None) -> int:
    """Serve a synthetic EKS cluster (``testing.synthetic.eks_cluster``) until stdin closes.

    Prints ``{"url": ..., "token": ..., "nodes": N, "pods": P}`` on one line once it is ready. The
    benchmark runs it as a separate process so that the refresher's memory and time are its own.
    """
    import argparse
    import sys

    import numpy as np

    from testing.synthetic import eks_cluster, managed_pods

    parser = argparse.ArgumentParser(prog="python -m testing.kube_double")
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--managed", type=int, default=0, help="extra pods with deletion-cost=managed, in 'web'")
    parser.add_argument("--token", default="local-token")
    args = parser.parse_args(argv)
    nodes, pods = eks_cluster(args.nodes, args.pods, np.random.default_rng(args.seed))
    pods += managed_pods(args.managed, time.time())
    api = KubeApiDouble(tokens=[args.token])
    api.load("nodes", nodes)
    api.load("pods", pods)
    del nodes, pods
    url = api.start()
    ready = {"url": url, "token": args.token, "nodes": args.nodes, "pods": args.pods, "managed": args.managed}
    print(json.dumps(ready), flush=True)
    try:
        sys.stdin.read()  # until the parent closes our stdin (or exits)
    finally:
        api.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
