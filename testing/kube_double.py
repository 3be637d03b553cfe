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

The requests are read by :mod:`testing.kube_double_requests`, the objects kept by
:mod:`testing.kube_double_store` and written as :mod:`testing.kube_double_objects` says.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from testing.kube_double_objects import conflict, encode, merge_patch, report_reservation, validate, with_kind
from testing.kube_double_requests import VERBS, ApiError, Route, decode_body, parse_route
from testing.kube_double_store import KubeStore


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
        self._store = KubeStore(resource_version)
        self._lock = self._store.lock  # which also guards the faults and the request log
        self._created = 0  # pods POSTed, for their UIDs
        self._faults: list[_Fault] = []
        self.requests: list[LoggedRequest] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- state -------------------------------------------------------------------------------
    def load(self, kind: str, objects: Iterable[Mapping[str, Any]]) -> None:
        """Add objects as they are, keeping their ``resourceVersion`` (fixtures) or assigning one."""
        self._store.load(kind, objects)

    @property
    def resource_version(self) -> int:
        return self._store.rv

    def set_resource_version(self, rv: int) -> None:
        with self._lock:
            self._store.rv = rv

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        """A deep copy of an object (for assertions); KeyError when absent."""
        return self._store.get(kind, name, namespace)

    def objects(self, kind: str) -> list[dict[str, Any]]:
        return self._store.objects(kind)

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
            route = parse_route(method, path)
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

    def _check_auth(self, header: str | None, method: str, route: Route) -> None:
        token = header[len("Bearer") :].strip() if header and header.startswith("Bearer") else ""
        if not token:
            verb = VERBS.get((method, route.name is None), "get")
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
        self, method: str, route: Route, query: Mapping[str, str], content_type: str, body: bytes
    ) -> tuple[int, bytes]:
        if route.kind == "resource.k8s.io":
            return 200, self._dra_group(method)
        if route.kind in ("deployments", "poddisruptionbudgets"):
            if method != "GET":
                raise ApiError(405, "MethodNotAllowed", f"the double serves {route.kind} read-only (load them)")
        elif route.kind not in ("nodes", "pods"):
            if not self.dra_api or route.version != self.dra_api.rpartition("/")[2]:
                raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
            if method != "GET":
                raise ApiError(405, "MethodNotAllowed", "the double serves DRA's objects read-only (load them)")
        if route.eviction:
            if method != "POST":
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on pods/eviction")
            return 201, self._evict(route, decode_body(body))
        if route.binding:
            if method != "POST":
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on pods/binding")
            return 201, self._bind(route, decode_body(body))
        if route.name is None:
            if method == "POST" and route.kind == "pods" and route.namespace:
                return 201, self._create(route, decode_body(body))
            if method != "GET":
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the list")
            api_version = {"nodes": "v1", "pods": "v1", "poddisruptionbudgets": "policy/v1"}.get(
                route.kind, self.dra_api
            )
            return 200, self._store.list_response(route, query, api_version)
        if method == "GET":
            with self._lock:
                return 200, with_kind(route.kind, self._store.entry(route).obj)
        if method == "PATCH":
            return 200, self._patch(route, content_type, decode_body(body))
        if method == "PUT":
            return 200, self._put(route, decode_body(body))
        if method == "DELETE":
            with self._lock:
                entry = self._store.entry(route)
                self._store.remove(route)
                return 200, with_kind(route.kind, entry.obj)
        raise ApiError(405, "MethodNotAllowed", f"the server does not allow the {method} method")

    def _dra_group(self, method: str) -> bytes:
        if not self.dra_api or method != "GET":
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        version = self.dra_api.rpartition("/")[2]
        entry = {"groupVersion": self.dra_api, "version": version}
        return encode({"kind": "APIGroup", "apiVersion": "v1", "name": "resource.k8s.io", "versions": [entry],
                       "preferredVersion": entry})  # fmt: skip

    # ---- writes ------------------------------------------------------------------------------
    def _write(self, route: Route, obj: dict[str, Any]) -> bytes:
        """Store ``obj`` (the caller holds the lock) and answer with it, as a write's reply."""
        self._store.put(route, obj)
        return with_kind(route.kind, obj)

    def _create(self, route: Route, obj: Any) -> bytes:
        """POST a pod to its namespace: 201 with its UID, or 409 ``AlreadyExists`` for a name in use."""
        name = (obj.get("metadata") or {}).get("name") if isinstance(obj, dict) else None
        if not isinstance(name, str) or not name:
            raise ApiError(422, "Invalid", "Pod is invalid: metadata.name: Required value: name is required")
        named = Route(route.kind, route.namespace, name, False)
        with self._lock:
            if self._store.has(route.kind, route.namespace, name):
                raise ApiError(409, "AlreadyExists", f'pods "{name}" already exists', {"name": name, "kind": "pods"})
            validate(named, obj)
            self._created += 1
            obj["metadata"].update(
                namespace=route.namespace,
                uid=f"00000000-0000-4000-8000-{self._created:012d}",
                creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            )
            obj.setdefault("status", {}).setdefault("phase", "Pending")
            if self.reservations_report:
                report_reservation(obj)
            return self._write(named, obj)

    def _patch(self, route: Route, content_type: str, patch: Any) -> bytes:
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
            current = self._store.entry(route).obj
            wanted_rv = (patch.get("metadata") or {}).get("resourceVersion")
            if wanted_rv is not None and wanted_rv != current["metadata"]["resourceVersion"]:
                raise conflict(route)
            updated = merge_patch(current, patch, strategic=strategic)
            validate(route, updated)
            return self._write(route, updated)

    def _put(self, route: Route, body: Any) -> bytes:
        if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
            raise ApiError(400, "BadRequest", "the body must be a v1 object with metadata")
        with self._lock:
            current = self._store.entry(route).obj
            if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                raise conflict(route)
            updated = copy.deepcopy(body)
            updated.pop("kind", None)
            updated.pop("apiVersion", None)
            validate(route, updated)
            return self._write(route, updated)

    def _evict(self, route: Route, eviction: Any) -> bytes:
        """The Eviction API as the real one answers: 404 for no such pod, 409 when the UID precondition names
        another pod, 429 when a loaded PodDisruptionBudget that selects the pod (by ``matchLabels``) allows no
        disruption; else the pod is deleted (the double has no grace periods)."""
        options = eviction.get("deleteOptions") if isinstance(eviction, dict) else None
        uid = ((options or {}).get("preconditions") or {}).get("uid")
        pod_route = Route("pods", route.namespace, route.name, False)
        with self._lock:
            pod = self._store.entry(pod_route).obj
            if uid is not None and pod["metadata"].get("uid") != uid:
                message = (
                    f"Precondition failed: UID in precondition: {uid}, UID in object meta: {pod['metadata'].get('uid')}"
                )
                raise ApiError(409, "Conflict", message, {"name": route.name, "kind": "pods"})
            labels = pod["metadata"].get("labels") or {}
            for budget in self._store.objects("poddisruptionbudgets"):
                wanted = ((budget.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
                same = (budget.get("metadata") or {}).get("namespace") == route.namespace
                allowed = int((budget.get("status") or {}).get("disruptionsAllowed") or 0)
                if same and allowed < 1 and all(labels.get(k) == v for k, v in wanted.items()):
                    name = budget["metadata"]["name"]
                    message = f"Cannot evict pod as it would violate the pod's disruption budget. {name}"
                    raise ApiError(429, "TooManyRequests", message)
            self._store.remove(pod_route)
        return encode({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})

    def _bind(self, route: Route, binding: Any) -> bytes:
        target = binding.get("target") if isinstance(binding, dict) else None
        node = target.get("name") if isinstance(target, dict) else None
        if not isinstance(node, str) or not node:
            raise ApiError(400, "BadRequest", "Binding.target.name is required")
        pod_route = Route("pods", route.namespace, route.name, False)
        with self._lock:
            pod = copy.deepcopy(self._store.entry(pod_route).obj)
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
            self._write(pod_route, pod)
        return encode({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})


def _fault_error(code: int) -> ApiError:
    reasons = {409: "Conflict", 410: "Expired", 429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}
    return ApiError(code, reasons.get(code, HTTPStatus(code).phrase.replace(" ", "")), f"injected fault {code}", {})


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
