"""Kubernetes API access for the refreshers and the bind: EKS tokens, cached cluster endpoints, and the calls.

Three ways to connect:

- :func:`connect_eks`: a Lambda's IAM role. The bearer token is an STS presigned
  ``GetCallerIdentity`` URL carrying the ``x-k8s-aws-id`` header, valid 60 s, sent as
  ``k8s-aws-v1.`` + base64url without padding (what ``aws eks get-token`` does). It is re-made
  before it expires. The endpoint and CA come from ``eks:DescribeCluster``, cached per process.
- :func:`connect_kubeconfig`: a kubeconfig file, for local use.
- :func:`connect_url`: a URL and a static token (the in-repo API double, a proxy).

Everything goes through the official ``kubernetes`` client, but responses are read as raw JSON
(``_preload_content=False``): turning 200,000 pods into generated model objects costs minutes and
gigabytes; dicts cost seconds. ``kubernetes`` is imported only when a client is made, so that the
extender's hot path never pays for it (DESIGN section 8).

Errors: each call goes through :class:`adapters.kube_transport.KubeTransport`, which retries 409, 429 and
5xx (and dropped connections) with bounded, jittered exponential backoff that honours ``Retry-After`` and
never runs past the caller's deadline. What is left is raised as
:class:`~adapters.kube_transport.KubeApiError`, carrying the code, reason and message from the server's
``Status``.
"""

from __future__ import annotations

import base64
import logging
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from adapters.errors import AdapterError
from adapters.kube_transport import KubeApiError, KubeTransport, ListExpiredError, RetryPolicy
from scheduler_core.k8s.names import DRA_GROUP, DRA_OBJECTS, DRA_VERSIONS

log = logging.getLogger(__name__)

TOKEN_PREFIX = "k8s-aws-v1."
TOKEN_EXPIRY_S = 60
TOKEN_REFRESH_AFTER_S = 45  # re-made well before the 60 s expiry
LIST_PAGE_SIZE = 500
MERGE_PATCH = "application/merge-patch+json"
DRA_KINDS = dict(
    zip(
        DRA_OBJECTS, ("list_device_class", "list_resource_slice", "list_resource_claim_for_all_namespaces"), strict=True
    )
)
"""The DRA objects the state reads, and their list calls in the generated client's ``Resource<version>Api``."""


class KubeConfigError(AdapterError):
    """A kubeconfig that cannot be used: no file, no current context, no cluster in it."""


# ---- EKS token -----------------------------------------------------------------------------------
class EksTokenSource:
    """Bearer tokens for one EKS cluster from an STS client, re-made after 45 s."""

    def __init__(self, sts_client: Any, cluster_name: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._sts = sts_client
        self._cluster = cluster_name
        self._clock = clock
        self._lock = threading.Lock()
        self._token = ""
        self._made_at = float("-inf")
        # botocore signs headers added before signing; the presigned URL then covers x-k8s-aws-id.
        sts_client.meta.events.register(
            "before-sign.sts.GetCallerIdentity", self._add_cluster_header, unique_id=f"x-k8s-aws-id-{id(self)}"
        )

    def _add_cluster_header(self, request: Any, **_: Any) -> None:
        request.headers["x-k8s-aws-id"] = self._cluster

    def token(self) -> str:
        with self._lock:
            now = self._clock()
            if now - self._made_at >= TOKEN_REFRESH_AFTER_S:
                url = self._sts.generate_presigned_url(
                    "get_caller_identity", Params={}, ExpiresIn=TOKEN_EXPIRY_S, HttpMethod="GET"
                )
                self._token = TOKEN_PREFIX + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")
                self._made_at = now
            return self._token


@dataclass(frozen=True)
class ClusterEndpoint:
    endpoint: str
    ca_file: str


_ENDPOINTS: dict[str, ClusterEndpoint] = {}


def describe_cluster(eks_client: Any, name: str) -> ClusterEndpoint:
    """Endpoint and CA of an EKS cluster, from ``DescribeCluster``; cached for the process."""
    cached = _ENDPOINTS.get(name)
    if cached is not None:
        return cached
    cluster = eks_client.describe_cluster(name=name)["cluster"]
    ca = base64.b64decode(cluster["certificateAuthority"]["data"])
    with tempfile.NamedTemporaryFile(prefix=f"eks-{name}-", suffix=".crt", delete=False) as handle:
        handle.write(ca)
    endpoint = ClusterEndpoint(cluster["endpoint"], handle.name)
    _ENDPOINTS[name] = endpoint
    return endpoint


# ---- connecting ----------------------------------------------------------------------------------
def connect_eks(cluster_name: str, *, session: Any = None, **options: Any) -> KubeClient:
    """A client for an EKS cluster, authenticated as the caller's IAM identity."""
    import boto3
    from kubernetes import client

    session = session or boto3.session.Session()
    endpoint = describe_cluster(session.client("eks"), cluster_name)
    tokens = EksTokenSource(session.client("sts"), cluster_name)
    # The client only asks the refresh hook once a key is present: start with one.
    configuration = client.Configuration(host=endpoint.endpoint, api_key={"authorization": tokens.token()})
    configuration.ssl_ca_cert = endpoint.ca_file
    configuration.api_key_prefix["authorization"] = "Bearer"
    configuration.connection_pool_maxsize = POOL_SIZE

    def refresh_token(conf: Any) -> None:
        conf.api_key["authorization"] = tokens.token()

    configuration.refresh_api_key_hook = refresh_token  # type: ignore[assignment]  # typed None upstream
    return KubeClient(client.ApiClient(configuration), **options)


def connect(
    *, cluster_name: str = "", api_url: str = "", token: str = "", kubeconfig: str = "", session: Any = None
) -> KubeClient:
    """The refreshers' one way in: an API URL and token, else a kubeconfig, else an EKS cluster name."""
    if api_url:
        return connect_url(api_url, token)
    if kubeconfig:
        return connect_kubeconfig(kubeconfig)
    return connect_eks(cluster_name, session=session)


_UNVERIFIED: set[str] = set()  # API servers already warned about
POOL_SIZE = 256
"""Keep-alive connections kept per API server: as many as requests a serve instance takes at once
(``gpu_scheduler.server.MAX_CONNECTIONS``; binds that wait for a GPU's UUID each hold one). The client's
default, five per CPU, made concurrent binds open and drop a connection each (urllib3's "connection pool
is full")."""


def connect_kubeconfig(path: str | None = None, context: str | None = None, **options: Any) -> KubeClient:
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        config.load_kube_config(config_file=path, context=context, client_configuration=configuration)  # type: ignore[no-untyped-call]
    except (config.ConfigException, OSError) as exc:  # no file, no context, no cluster in it
        where = path or "$KUBECONFIG or ~/.kube/config"
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise KubeConfigError(f"kubeconfig {where}: {reason}") from exc
    configuration.connection_pool_maxsize = POOL_SIZE
    api_client = client.ApiClient(configuration)
    host = configuration.host
    if not api_client.configuration.verify_ssl and host not in _UNVERIFIED:
        # urllib3 warns on every request; once is enough for a choice the kubeconfig made.
        import urllib3

        _UNVERIFIED.add(host)
        log.warning("the kubeconfig turns off TLS verification (insecure-skip-tls-verify) for %s", host)
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    return KubeClient(api_client, **options)


def connect_url(url: str, token: str, **options: Any) -> KubeClient:
    from kubernetes import client

    configuration = client.Configuration(host=url, api_key={"authorization": token})
    configuration.api_key_prefix["authorization"] = "Bearer"
    configuration.connection_pool_maxsize = POOL_SIZE
    return KubeClient(client.ApiClient(configuration), **options)


# ---- the client ----------------------------------------------------------------------------------
class KubeClient(KubeTransport):
    """The calls the refreshers make, on raw JSON, with retries bounded by an optional deadline
    (:class:`~adapters.kube_transport.KubeTransport`).

    Parameters
    ----------
    deadline : callable returning the seconds left, or None for no deadline. A call is not started
        (nor retried) with less than ``min_call_s`` left; :class:`DeadlineReachedError` is raised instead.
    """

    def __init__(
        self,
        api_client: Any,
        *,
        retry: RetryPolicy | None = None,
        deadline: Callable[[], float] | None = None,
        min_call_s: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        from kubernetes import client

        super().__init__(retry=retry, deadline=deadline, min_call_s=min_call_s, sleep=sleep)
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.dra_version = ""  # set by dra_api()

    # -- reads --
    def list_with_version(
        self, kind: str, *, label_selector: str = "", field_selector: str = "", item_type: Any = None, restarts: int = 2
    ) -> tuple[list[dict[str, Any]], str]:
        """Every item of a cluster-wide list (``nodes`` or ``pods``, ``limit=500`` pages with ``continue``)
        and the list's ``resourceVersion``, the point a watch resumes from.

        ``item_type`` (a TypedDict from :mod:`adapters.kube_types`) decodes each item into just those
        keys; a page that does not fit it is decoded in full instead, so nothing is lost. A continue
        token that expires mid-list (410) starts the list over, at most ``restarts`` times; then
        :class:`ListExpiredError` is raised.
        """
        for attempt in range(restarts + 1):
            items: list[dict[str, Any]] = []
            version = ""
            try:
                for page, page_version in self._pages(kind, label_selector, field_selector, LIST_PAGE_SIZE, item_type):
                    items.extend(page)
                    version = version or page_version  # every page of one list is the same snapshot: the first's
                return items, version
            except ListExpiredError:
                if attempt == restarts:
                    raise
                log.warning("list of %s expired mid-way; starting over (%d/%d)", kind, attempt + 1, restarts)
        raise AssertionError("unreachable")

    def _pages(
        self, kind: str, label_selector: str, field_selector: str, limit: int, item_type: Any
    ) -> Iterator[tuple[list[dict[str, Any]], str]]:
        method = self._list_method(kind)
        token: str | None = None
        while True:
            page = self._json(
                method,
                label_selector=label_selector or None,
                field_selector=field_selector or None,
                limit=limit,
                _continue=token,
                _item_type=item_type,
            )
            metadata = page.get("metadata") or {}
            yield page.get("items") or [], str(metadata.get("resourceVersion") or "")
            token = metadata.get("continue")
            if not token:
                return

    def watch(
        self, kind: str, resource_version: str, *, field_selector: str = "", item_type: Any = None, timeout_s: int = 300
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(type, object)`` for each change to ``nodes`` or ``pods`` after ``resource_version``, with
        bookmarks (``BOOKMARK``, whose object carries only a newer ``resourceVersion``), until the server
        ends the watch (about ``timeout_s``). Objects are decoded into ``item_type`` as lists are.

        Raises :class:`ListExpiredError` when ``resource_version`` is too old (410: list again), and
        :class:`KubeApiError` for any other refusal or a broken stream.
        """
        yield from self._stream(
            self._list_method(kind), f"the watch of {kind}", item_type,
            watch=True, resource_version=resource_version, allow_watch_bookmarks=True,
            timeout_seconds=timeout_s, field_selector=field_selector or None,
            _request_timeout=(10, timeout_s + 30),
        )  # fmt: skip

    def _list_method(self, kind: str) -> Callable[..., Any]:
        """The generated client's list call of ``kind``: ``nodes``, ``pods``, or one of :data:`DRA_KINDS`
        in the version :meth:`dra_api` found."""
        if kind == "nodes":
            return self.core.list_node
        if kind == "pods":
            return self.core.list_pod_for_all_namespaces
        if kind not in DRA_KINDS or not self.dra_version:
            raise ValueError(f"cannot list {kind!r}: nodes, pods, or {', '.join(DRA_KINDS)} once dra_api() found DRA")
        from kubernetes import client

        api = getattr(client, f"Resource{self.dra_version.capitalize()}Api")(self.api_client)
        return getattr(api, DRA_KINDS[kind])  # type: ignore[no-any-return]

    def dra_api(self) -> str:
        """The ``resource.k8s.io`` version the product reads that the API server serves, preferred first
        (:data:`~scheduler_core.k8s.names.DRA_VERSIONS`), as ``resource.k8s.io/v1``; "" when it serves
        none (DRA off, or a cluster before 1.32). Remembered for :data:`DRA_KINDS` lists and watches."""
        from kubernetes import client

        try:
            group = self._json(client.ResourceApi(self.api_client).get_api_group)
        except KubeApiError as exc:
            if exc.status != 404:
                raise
            group = {}
        served = {str(v.get("version")) for v in group.get("versions") or [] if isinstance(v, dict)}
        self.dra_version = next((v for v in DRA_VERSIONS if v in served), "")
        return f"{DRA_GROUP}/{self.dra_version}" if self.dra_version else ""

    def list_all(
        self,
        kind: str,
        *,
        label_selector: str = "",
        field_selector: str = "",
        item_type: Any = None,
        restarts: int = 2,
    ) -> list[dict[str, Any]]:
        """Every item of a list (see :meth:`list_with_version`)."""
        return self.list_with_version(
            kind, label_selector=label_selector, field_selector=field_selector, item_type=item_type, restarts=restarts
        )[0]

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self._json(self.core.read_namespaced_pod, name, namespace)

    def get_node(self, name: str) -> dict[str, Any]:
        return self._json(self.core.read_node, name)

    def get_deployment(self, namespace: str, name: str) -> dict[str, Any]:
        from kubernetes import client

        return self._json(client.AppsV1Api(self.api_client).read_namespaced_deployment, name, namespace)

    def list_disruption_budgets(self) -> list[dict[str, Any]]:
        """Every PodDisruptionBudget (``policy/v1``) of the cluster, in one list."""
        from kubernetes import client

        api = client.PolicyV1Api(self.api_client)
        page = self._json(api.list_pod_disruption_budget_for_all_namespaces)
        return list(page.get("items") or [])

    # -- writes --
    def evict_pod(self, namespace: str, name: str, uid: str) -> dict[str, Any]:
        """POST the pod's ``eviction`` subresource (``policy/v1``), as ``kubectl drain`` does: the API server
        deletes the pod gracefully only if every PodDisruptionBudget over it allows (429 otherwise). The UID
        precondition makes it that pod or none (409 when the name now belongs to another). 429, 404 and 409
        are not retried: they are the caller's answer."""
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}},
        }
        return self._json(
            self.core.create_namespaced_pod_eviction, name, namespace, body, _retry_409=False, _retry_429=False
        )

    def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> dict[str, Any]:
        """One merge patch of ``metadata.labels`` (a ``None`` value removes the label)."""
        body = {"metadata": {"labels": dict(labels)}}
        return self._json(self.core.patch_node, name, body, _content_type=MERGE_PATCH)

    def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None], *, retry_conflicts: bool = True
    ) -> dict[str, Any]:
        body = {"metadata": {"annotations": dict(annotations)}}
        return self._json(
            self.core.patch_namespaced_pod, name, namespace, body, _content_type=MERGE_PATCH, _retry_409=retry_conflicts
        )

    def create_pod(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST a pod; a 409 (one of that name exists) is not retried: it is the caller's answer."""
        return self._json(self.core.create_namespaced_pod, namespace, dict(body), _retry_409=False)

    def delete_pod(self, namespace: str, name: str, *, grace_period_s: int | None = None) -> dict[str, Any]:
        """DELETE a pod (``grace_period_s`` 0: at once, the name free on return); 404 is the caller's."""
        options: dict[str, Any] = {} if grace_period_s is None else {"grace_period_seconds": grace_period_s}
        return self._json(self.core.delete_namespaced_pod, name, namespace, **options)

    def bind_pod(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """POST the pod's ``binding`` subresource, as kube-scheduler's binder does. A 409 (already
        bound) is not retried. The API server does not check ``metadata.uid`` (captured in
        ``b7c-binding-wrong-uid-accepted-201``): callers check the UID themselves. ``annotations`` are
        merged onto the pod by the same write (the binding registry copies a Binding's annotations)."""
        metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
        if annotations:
            metadata["annotations"] = dict(annotations)
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        return self._json(self.core.create_namespaced_pod_binding, name, namespace, body, _retry_409=False)
