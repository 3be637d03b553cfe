"""Kubernetes manifests for the second scheduler and for the Lambdas' cluster access.

One source for both ways out: the CDK app writes them to ``cdk.out/manifests/gpu-scheduler.yaml`` (and
applies them through ``aws_eks_v2`` when asked), and ``gpu-scheduler scheduler-config`` writes the same
documents for a URL given on the command line.

What is generated:

- ``manifests.access``: one ClusterRole per Lambda's Kubernetes group (EKS access entries map each IAM
  role onto its own group), with the least verbs each uses, and the ValidatingAdmissionPolicies that keep
  each identity to its own labels and annotations.
- ``scheduler_manifests``: the upstream kube-scheduler running as a second scheduler named
  ``gpu-scheduler``: ServiceAccount, the RBAC it needs, a ConfigMap with its ``KubeSchedulerConfiguration``
  (``kubescheduler.config.k8s.io/v1``) calling our extender, a Deployment with probes, and a PDB.

Choices that matter (DESIGN sections 4 and 8):

- ``percentageOfNodesToScore: 100`` at the top level (a per-profile value is rejected by the captured
  v1beta3 scheduler), so the extender sees every feasible node: bin-packing needs the whole picture.
- ``nodeCacheCapable: true``: names only, about 7 KB per request instead of about 1.2 MB at 500 nodes.
- No ``managedResources`` (by default): the extender is called for every pod of the profile, those that
  request no GPU included, because where a CPU-only pod's CPU goes decides whether a GPU node's free
  GPUs stay usable (``docs/scheduling.md#one-policy-for-every-pod``; on openb ``default`` through the real
  kube-scheduler, 11.03 % of GPUs left unallocated with the CPU-only pods left to kube-scheduler's
  plugins). ``nvidia.com/gpu`` stays counted by the scheduler. With sharing on, kube-scheduler does not
  count ``gpu-scheduler.io/gpu-milli`` (NodeResourcesFit's ``ignoredResources``), because then the
  extender's bind verb owns that accounting; without sharing a milli request stays unschedulable instead
  of landing on a node with no accounting at all (the captured ``03c``/``03d`` runs show kube-scheduler
  binding such pods anywhere). ``gpu_pods_only`` restores ``managedResources`` (``nvidia.com/gpu``, and
  ``gpu-milli`` with ``ignoredByScheduler: true`` when sharing, and every ``nvidia.com/mig-<profile>`` of
  ``scheduler_core.k8s.mig.KNOWN_PROFILES``): the extender then sees GPU pods only.
- ``clientConnection`` qps 100 and burst 200: the default 50/100 caps binds at about 50 pods/s.
"""

from __future__ import annotations

import copy
import hashlib
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from manifests.access import admission_policies, lambda_rbac, priority_class_policy, security_group_policy_guard
from manifests.nodepool import CONSOLIDATION_POLICIES, gpu_nodepools
from manifests.placeholder import NAMESPACE as PLACEHOLDER_NAMESPACE
from manifests.placeholder import PRIORITY_CLASS as PLACEHOLDER_CLASS
from manifests.placeholder import placeholder_manifests
from manifests.reservation import DEFAULT_IMAGE as RESERVATION_IMAGE
from manifests.reservation import NAMESPACE as RESERVATION_NAMESPACE
from manifests.reservation import PRIORITY_CLASS as RESERVATION_CLASS
from manifests.reservation import image_problems, reservation_manifests, reserving
from manifests.share_env import MUTATING_APIS, share_env_mutation, share_env_policy
from scheduler_core.errors import ConfigError
from scheduler_core.k8s.mig import known_mig_resources
from scheduler_core.k8s.names import MILLI_RESOURCE, SHARE_DEVICES

GPU_RESOURCE = "nvidia.com/gpu"
SCHEDULER_NAME = "gpu-scheduler"
# The Kubernetes user the AMP managed scraper's role is mapped to.
SCRAPER_USER = "aps-collector-user"
# kube-scheduler must not be newer than the API server: set the tag to the cluster's minor version.
DEFAULT_IMAGE = "registry.k8s.io/kube-scheduler:v1.33.5"
BIND_HTTP_TIMEOUT_S = 15.0
"""The bind's ``httpTimeout`` with reservation pods: the bind's own budget (2.5 s), the wait for a new
GPU's reservation pod to report its UUID (``manifests.reservation.UUID_WAIT_S``, 10 s), and a margin.
Under API Gateway's 29 s."""
CONFIG_PATH = "/etc/kubernetes/gpu-scheduler"
CONFIG_FILE = "config.yaml"
BREAK_GLASS_FILE = "break-glass.yaml"
CONFIG_ENV = "GPU_SCHEDULER_CONFIG"
"""The Deployment's variable that names which of the ConfigMap's two configurations kube-scheduler reads:
``config.yaml`` (the extender's), or ``break-glass.yaml`` (none: :func:`break_glass_configuration`).
``kubectl -n kube-system set env deployment/gpu-scheduler GPU_SCHEDULER_CONFIG=break-glass.yaml`` rolls the
pods onto it; ``=config.yaml`` back (docs/deploy.md#the-way-back)."""
SECURE_PORT = 10259
CONFIG_HASH_ANNOTATION = "gpu-scheduler.io/config-sha256"
_LABELS = {"app.kubernetes.io/name": SCHEDULER_NAME, "app.kubernetes.io/part-of": "eks-gpu-scheduler"}
POD_SELECTOR = {"app.kubernetes.io/name": SCHEDULER_NAME}
"""The scheduler's pods, and only them: the Deployment's selector, its PDB's, and its SecurityGroupPolicy's
(which ``gpu-scheduler-security-group`` holds to exactly this)."""


def feature_gates(version: str) -> dict[str, bool]:
    """The feature gates the second kube-scheduler runs with, by its version (``v1.33.5``, the image's
    tag; any other text gets none).

    1.33 turns ``SchedulerAsyncPreemption`` on (beta): a preemptor whose second cycle runs before the
    scheduler's cache sees its victim gone starts a redundant preemption that emits no event, and
    waits up to five minutes for the unschedulable flush (kubernetes/kubernetes#141694; through the
    real 1.33.3 here, one preemption in three). Synchronous preemption does not race: it is turned back
    on for 1.33, where the gate exists and is not locked.

    >>> feature_gates("v1.33.5"), feature_gates("v1.34.1"), feature_gates("latest")
    ({'SchedulerAsyncPreemption': False}, {}, {})
    """
    found = re.fullmatch(r"v?(\d+)\.(\d+)\.\d+(?:[-+].*)?", version)
    if found and (int(found[1]), int(found[2])) == (1, 33):
        return {"SchedulerAsyncPreemption": False}
    return {}


def feature_gate_flags(gates: Mapping[str, bool]) -> list[str]:
    """``--feature-gates=A=false,B=true`` for ``gates``, sorted; nothing for none."""
    return [f"--feature-gates={','.join(f'{k}={str(v).lower()}' for k, v in sorted(gates.items()))}"] if gates else []


@dataclass(frozen=True, kw_only=True)
class SchedulerOptions:
    """What the second scheduler's manifests depend on.

    ``extender_url`` is the extender's base URL, stage included (kube-scheduler appends ``/filter``...):
    ``https://`` for the private API, or ``http://`` on loopback for ``gpu-scheduler serve`` beside a
    local kube-scheduler (a trial, or the e2e suite). ``node_cache_capable`` False sends full Node
    objects instead of names: for small development clusters without a snapshot only.

    The private API's endpoint admits one security group, :attr:`security_group`: a ``SecurityGroupPolicy``
    puts the scheduler pods in it (Security Groups for Pods), or ``node_selector`` runs them on a node group
    that carries it (tolerating those label keys' taints).
    """

    extender_url: str
    sharing: bool = False
    node_cache_capable: bool = True
    weight: int = 5
    http_timeout_s: float = 3.0
    bind_http_timeout_s: float = BIND_HTTP_TIMEOUT_S
    """With sharing and reservation pods: the bind's own ``httpTimeout`` (:func:`extender_entries`)."""
    image: str = DEFAULT_IMAGE
    namespace: str = "kube-system"
    replicas: int = 2
    client_qps: int = 100
    client_burst: int = 200
    bin_pack: bool = True
    """The profile's NodeResourcesFit scores by MostAllocated, GPUs included: where the extender sees
    no difference, kube-scheduler packs instead of spreading (see :func:`profile`)."""
    reservation_image: str = RESERVATION_IMAGE
    """With sharing: the image reservation pods run (``manifests/reservation.py``); ``none``: none are
    made, and the extender's ``RESERVATION_IMAGE`` must say ``none`` too."""
    mutating_policy: str = ""
    """With reservation pods: the ``admissionregistration.k8s.io`` version of the MutatingAdmissionPolicy
    that gives share pods their environment (``manifests.share_env.MUTATING_APIS``), where the API server
    serves one; empty (EKS, 2026): none, and share pods carry the entries themselves."""
    share_device: str = "cdi"
    """With reservation pods: how a share's GPU reaches its containers (the extender's ``SHARE_DEVICE``): the
    share-env policy asks each container for ``NVIDIA_VISIBLE_DEVICES``'s entry with ``env`` only."""
    gpu_pods_only: bool = False
    """Call the extender only for pods that request a GPU resource (``managedResources``); by default
    it is called for every pod of the profile, so that CPU-only pods strand no GPU."""
    karpenter_node_class: str = ""
    """The ``EC2NodeClass`` the GPU NodePools launch on (``manifests/nodepool.py``); empty: no NodePools."""
    karpenter_consolidation: str = "WhenEmpty"
    """The whole-GPU NodePool's ``consolidationPolicy`` (the shared pool's is always ``WhenEmpty``)."""
    security_group: str = ""
    """The security group the extender's endpoint admits. Without ``node_selector`` the scheduler pods get it
    from a ``SecurityGroupPolicy`` (the VPC CNI's ``ENABLE_POD_ENI``); with one, their nodes carry it. Either
    way ``gpu-scheduler-security-group`` keeps any other SecurityGroupPolicy from naming it. Empty: neither
    is written."""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    """Labels of the nodes the scheduler pods run on (a node group in :attr:`security_group`); the pods
    tolerate taints with these keys."""

    def problems(self) -> list[str]:
        """Every invalid option, by name."""
        found = []
        if not isinstance(self.extender_url, str) or not (
            self.extender_url.startswith("https://") or _loopback_http(self.extender_url)
        ):
            found.append(
                "extender_url: expected an https:// URL, or http:// on loopback (127.0.0.1, localhost, [::1]) "
                f"for serve beside a local kube-scheduler, got {self.extender_url!r}"
            )
        # kube-scheduler validates 0 < weight; the extender's score counts weight × 0..10 per node.
        if not isinstance(self.weight, int) or isinstance(self.weight, bool) or not 1 <= self.weight <= 100:
            found.append(f"weight: expected an integer in 1..100, got {self.weight!r}")
        if not isinstance(self.http_timeout_s, int | float) or not 0 < self.http_timeout_s <= 30:
            found.append(f"http_timeout_s: expected seconds in (0, 30], got {self.http_timeout_s!r}")
        if not isinstance(self.bind_http_timeout_s, int | float) or not 0 < self.bind_http_timeout_s <= 29:
            found.append(f"bind_http_timeout_s: expected seconds in (0, 29], got {self.bind_http_timeout_s!r}")
        if not isinstance(self.image, str) or not self.image or any(c.isspace() for c in self.image):
            found.append(f"image: expected a container image reference, got {self.image!r}")
        found += image_problems("reservation_image", self.reservation_image)
        if self.share_device not in SHARE_DEVICES:
            found.append(f"share_device: expected one of {', '.join(SHARE_DEVICES)}, got {self.share_device!r}")
        if self.mutating_policy not in ("", *MUTATING_APIS):
            found.append(
                f"mutating_policy: expected one of {', '.join(MUTATING_APIS)} or empty, got {self.mutating_policy!r}"
            )
        if not isinstance(self.replicas, int) or isinstance(self.replicas, bool) or self.replicas < 1:
            found.append(f"replicas: expected an integer >= 1, got {self.replicas!r}")
        for name in ("client_qps", "client_burst"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                found.append(f"{name}: expected an integer >= 1, got {value!r}")
        if self.karpenter_consolidation not in CONSOLIDATION_POLICIES:
            found.append(
                f"karpenter_consolidation: expected one of {', '.join(CONSOLIDATION_POLICIES)}, "
                f"got {self.karpenter_consolidation!r}"
            )
        if self.karpenter_node_class and not _DNS_NAME.fullmatch(self.karpenter_node_class):
            found.append(f"karpenter_node_class: expected an EC2NodeClass name, got {self.karpenter_node_class!r}")
        if not isinstance(self.security_group, str) or not (
            not self.security_group
            or _SECURITY_GROUP.fullmatch(self.security_group)
            or _TOKEN.fullmatch(self.security_group)
        ):
            found.append(f"security_group: expected a security group ID (sg-...), got {self.security_group!r}")
        if not isinstance(self.node_selector, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) and _LABEL_KEY.fullmatch(k) and _LABEL_VALUE.fullmatch(v)
            for k, v in self.node_selector.items()
        ):
            found.append(f"node_selector: expected label keys and values (key=value), got {self.node_selector!r}")
        elif len(self.node_selector) > MAX_NODE_SELECTOR:
            found.append(f"node_selector: at most {MAX_NODE_SELECTOR} labels, got {len(self.node_selector)}")
        return found

    def validated(self) -> SchedulerOptions:
        problems = self.problems()
        if problems:
            raise ConfigError("; ".join(problems))
        return self


_DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
"""A Kubernetes object name (DNS subdomain)."""
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}")
_LABEL_VALUE = re.compile(rf"({_LABEL_NAME})?")
MAX_NODE_SELECTOR = 8
_SECURITY_GROUP = re.compile(r"sg-[0-9a-f]{8}(?:[0-9a-f]{9})?")
_TOKEN = re.compile(r"\$\{Token\[[A-Za-z0-9_.-]+\]\}")
"""A CDK token: a security group the stack makes, known after deploy."""
SECURITY_GROUP_POLICY_API = "vpcresources.k8s.aws/v1beta1"
"""The VPC resource controller's ``SecurityGroupPolicy`` (EKS runs the controller; the VPC CNI needs
``ENABLE_POD_ENI=true`` and the nodes a trunk interface)."""


def _loopback_http(url: str) -> bool:
    """``http://`` to this host only: a request in the clear never leaves the pod or the machine.

    >>> _loopback_http("http://127.0.0.1:8888"), _loopback_http("http://10.0.0.5:8888")
    (True, False)
    """
    parsed = urllib.parse.urlsplit(url)
    return parsed.scheme == "http" and parsed.hostname in ("127.0.0.1", "localhost", "::1")


def _duration(seconds: float) -> str:
    """A Go duration string: ``3s``, ``1500ms``."""
    return f"{int(seconds)}s" if float(seconds).is_integer() else f"{round(seconds * 1000)}ms"


def extender_entries(options: SchedulerOptions) -> list[dict[str, Any]]:
    """The ``extenders[]`` of the KubeSchedulerConfiguration: :func:`extender_entry`, and with sharing and
    reservation pods a second entry at the same URL for ``bind`` only, with its own ``httpTimeout``.

    kube-scheduler gives each extender one ``httpTimeout`` for all its verbs. Filter and prioritize run in
    its scheduling cycle, one pod at a time, and keep the short one; the bind of the first share on a GPU
    waits for the reservation pod to report the GPU's UUID (``manifests/share_env.py``), in the binding
    cycle, which runs apart for each pod. A scheduler allows one binder among its extenders: the entry
    that filters does not bind then.
    """
    main = extender_entry(options)
    if not (options.sharing and reserving(options.reservation_image)):
        return [main]
    main.pop("bindVerb")
    binder = {
        "urlPrefix": main["urlPrefix"],
        "bindVerb": "bind",
        "enableHTTPS": main["enableHTTPS"],
        "httpTimeout": _duration(options.bind_http_timeout_s),
        "nodeCacheCapable": main["nodeCacheCapable"],
    }
    if "managedResources" in main:
        binder["managedResources"] = copy.deepcopy(main["managedResources"])
    return [main, binder | {"ignorable": False}]


def extender_entry(options: SchedulerOptions) -> dict[str, Any]:
    """The ``extenders[]`` entry that filters and prioritizes (and, with sharing, preempts and binds,
    unless :func:`extender_entries` gives the bind its own) (v1 field names)."""
    managed: list[dict[str, Any]] = [{"name": GPU_RESOURCE, "ignoredByScheduler": False}]
    # managedResources matches exact names: every MIG profile the product knows (mixed strategy).
    managed += [{"name": name, "ignoredByScheduler": False} for name in known_mig_resources()]
    entry: dict[str, Any] = {
        "urlPrefix": options.extender_url.rstrip("/"),
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
    }
    if options.sharing:
        entry |= {"bindVerb": "bind", "preemptVerb": "preempt"}
        managed.append({"name": MILLI_RESOURCE, "ignoredByScheduler": True})
    entry |= {
        "weight": options.weight,
        "enableHTTPS": options.extender_url.startswith("https://"),
        "httpTimeout": _duration(options.http_timeout_s),
        "nodeCacheCapable": options.node_cache_capable,
    }
    if options.gpu_pods_only:
        entry["managedResources"] = managed
    # Not ignorable: a GPU pod placed without the extender's view is worse than a retried one.
    return entry | {"ignorable": False}


def scheduler_configuration(options: SchedulerOptions) -> dict[str, Any]:
    """The ``KubeSchedulerConfiguration`` the second scheduler runs with.

    >>> config = scheduler_configuration(SchedulerOptions(extender_url="https://x.example/prod"))
    >>> config["profiles"][0]["schedulerName"], config["percentageOfNodesToScore"], config["extenders"][0]["urlPrefix"]
    ('gpu-scheduler', 100, 'https://x.example/prod')
    """
    options.validated()
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"qps": options.client_qps, "burst": options.client_burst},
        "leaderElection": {
            "leaderElect": True,
            "resourceLock": "leases",
            "resourceName": SCHEDULER_NAME,
            "resourceNamespace": options.namespace,
        },
        "percentageOfNodesToScore": 100,
        "profiles": [profile(options)],
        "extenders": extender_entries(options),
    }


def break_glass_configuration(options: SchedulerOptions) -> dict[str, Any]:
    """The second scheduler without the extender, for when the extender cannot answer (its API, its
    snapshot, its network): the same profile, leader election and packing, and no ``extenders``, so that
    every pod of the profile is placed by kube-scheduler's own plugins. ``nvidia.com/gpu`` stays counted by
    kube-scheduler; ``gpu-scheduler.io/gpu-milli`` is no longer ignored, so a share, which only the
    extender's bind can account, waits (Pending, ``Insufficient gpu-scheduler.io/gpu-milli``) instead of
    landing on a GPU no ledger knows of.

    >>> config = break_glass_configuration(SchedulerOptions(extender_url="https://x.example/prod", sharing=True))
    >>> "extenders" in config, config["profiles"][0]["pluginConfig"][0]["args"].get("ignoredResources")
    (False, None)
    """
    config = scheduler_configuration(replace(options, sharing=False))
    del config["extenders"]
    return config


def profile(options: SchedulerOptions) -> dict[str, Any]:
    """The ``gpu-scheduler`` profile: the default plugins, with NodeResourcesFit's score set to pack.

    kube-scheduler adds the extender's score (weight x 10 x 0..10) to its score plugins' (0..100 each,
    times their weights). Its default NodeResourcesFit scores ``LeastAllocated`` on CPU and memory: on
    nodes the extender scores alike (every empty node, or every node for a share when the policy sees
    no difference) it sends each pod to the emptiest, one per node. ``MostAllocated`` on CPU, memory
    and ``nvidia.com/gpu`` breaks those ties toward the fullest node instead. The GPUs weigh as much as
    CPU and memory, no more: ``MostAllocated`` scores a GPU pod by the share of the node's GPUs taken,
    which favours the nodes with few GPUs, and weighted 5 it outvoted the extender's ranking (one step
    of its 0..10 is worth 50 points at weight 5): through the real kube-scheduler, openb ``gpuspec33``
    left 13.65 % of GPUs unallocated against 12.63 with weight 1
    (docs/benchmarks.md#placement-quality-through-the-real-kube-scheduler-replay). The other
    default score plugins keep acting (docs/scheduling.md says which and why). With sharing, and no
    ``managedResources`` to say so, NodeResourcesFit ignores ``gpu-scheduler.io/gpu-milli``: the
    extender's bind accounts it.
    """
    fit_args: dict[str, Any] = {}
    if options.bin_pack:
        resources = [{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}, {"name": GPU_RESOURCE, "weight": 1}]
        fit_args["scoringStrategy"] = {"type": "MostAllocated", "resources": resources}
    if options.sharing and not options.gpu_pods_only:
        fit_args["ignoredResources"] = [MILLI_RESOURCE]
    if not fit_args:
        return {"schedulerName": SCHEDULER_NAME}
    return {"schedulerName": SCHEDULER_NAME, "pluginConfig": [{"name": "NodeResourcesFit", "args": fit_args}]}


def _meta(name: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(_LABELS)}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def _scheduler_rbac(namespace: str) -> list[dict[str, Any]]:
    """What the upstream kube-scheduler needs as a second scheduler (the Kubernetes multiple-schedulers
    guide): the built-in ``system:kube-scheduler`` and ``system:volume-scheduler`` roles, reading the
    authentication config, and its own leader-election lease (the built-in role only names
    ``kube-scheduler``'s)."""
    subject = [{"kind": "ServiceAccount", "name": SCHEDULER_NAME, "namespace": namespace}]

    def binding(kind: str, name: str, role_kind: str, role: str, ns: str | None = None) -> dict[str, Any]:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": kind,
            "metadata": _meta(name, ns),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
            "subjects": subject,
        }

    lease_role = f"{SCHEDULER_NAME}-leader-election"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(SCHEDULER_NAME, namespace)},
        binding("ClusterRoleBinding", f"{SCHEDULER_NAME}-as-kube-scheduler", "ClusterRole", "system:kube-scheduler"),
        binding(
            "ClusterRoleBinding", f"{SCHEDULER_NAME}-as-volume-scheduler", "ClusterRole", "system:volume-scheduler"
        ),
        binding(
            "RoleBinding",
            f"{SCHEDULER_NAME}-extension-apiserver-authentication-reader",
            "Role",
            "extension-apiserver-authentication-reader",
            namespace,
        ),
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(lease_role, namespace),
            "rules": [
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "resourceNames": [SCHEDULER_NAME],
                    "verbs": ["get", "update", "patch"],
                },
            ],
        },
        binding("RoleBinding", lease_role, "Role", lease_role, namespace),
    ]


def scheduler_manifests(options: SchedulerOptions) -> list[dict[str, Any]]:
    """Every document for the second scheduler, in apply order.

    >>> docs = scheduler_manifests(SchedulerOptions(extender_url="https://x.example/prod"))
    >>> [d["kind"] for d in docs][-3:]
    ['ConfigMap', 'Deployment', 'PodDisruptionBudget']
    """
    options.validated()
    ns = options.namespace
    config_text = dump_yaml(scheduler_configuration(options))
    break_glass_text = dump_yaml(break_glass_configuration(options))
    config_hash = hashlib.sha256((config_text + break_glass_text).encode()).hexdigest()[:16]
    selector = dict(POD_SELECTOR)
    probe = {"httpGet": {"path": "/healthz", "port": SECURE_PORT, "scheme": "HTTPS"}}
    container = {
        "name": "kube-scheduler",
        "image": options.image,
        "command": [
            "kube-scheduler",
            # Which configuration: CONFIG_ENV (kubelet expands $(VAR) in a command from the container's env).
            f"--config={CONFIG_PATH}/$({CONFIG_ENV})",
            # /metrics without a token, for the AMP managed scraper (which cannot present one); the
            # probe paths are already anonymous by default.
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
            "--v=2",
            *feature_gate_flags(feature_gates(options.image.rpartition(":")[2])),
        ],
        "env": [{"name": CONFIG_ENV, "value": CONFIG_FILE}],
        "ports": [{"name": "https", "containerPort": SECURE_PORT}],
        "livenessProbe": probe | {"initialDelaySeconds": 15, "periodSeconds": 10, "failureThreshold": 3},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": SECURE_PORT, "scheme": "HTTPS"}}
        | {"periodSeconds": 10},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_PATH, "readOnly": True}],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(SCHEDULER_NAME, ns),
        "spec": {
            "replicas": options.replicas,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {
                    "labels": dict(_LABELS),
                    # kube-scheduler reads its configuration once: a new text rolls the pods.
                    "annotations": {CONFIG_HASH_ANNOTATION: config_hash},
                },
                "spec": {
                    "serviceAccountName": SCHEDULER_NAME,
                    "priorityClassName": "system-cluster-critical",
                    "containers": [container],
                    "volumes": [{"name": "config", "configMap": {"name": f"{SCHEDULER_NAME}-config"}}],
                    **_placement(options.node_selector),
                    # Replicas on different nodes, so losing one node keeps a scheduler (leader election
                    # picks which one is active).
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "ScheduleAnyway",
                            "labelSelector": {"matchLabels": selector},
                        }
                    ],
                },
            },
        },
    }
    return [
        *_scheduler_rbac(ns),
        # Before the Deployment: the VPC resource controller gives a pod its branch interface when the pod is
        # created, so a pod made before its policy keeps the node's security groups until it is replaced.
        *_security_group_policy(options),
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _meta(f"{SCHEDULER_NAME}-config", ns),
            "data": {CONFIG_FILE: config_text, BREAK_GLASS_FILE: break_glass_text},
        },
        deployment,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": _meta(SCHEDULER_NAME, ns),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector}},
        },
    ]


def _placement(node_selector: Mapping[str, str]) -> dict[str, Any]:
    """The pod spec's ``nodeSelector`` and the tolerations of those keys' taints, for the scheduler pods on a
    node group of their own (nothing without one)."""
    if not node_selector:
        return {}
    return {
        "nodeSelector": dict(node_selector),
        "tolerations": [{"key": key, "operator": "Exists"} for key in sorted(node_selector)],
    }


def parse_node_selector(items: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """``key=value`` items as a node selector, and the items without ``=`` (for the caller to name); the
    keys and values themselves are :meth:`SchedulerOptions.problems`' to check.

    >>> parse_node_selector(["role=scheduler", "pool"])
    ({'role': 'scheduler'}, ['pool'])
    """
    pairs = [item.partition("=") for item in items]
    return {key: value for key, equals, value in pairs if equals}, [key for key, equals, _ in pairs if not equals]


def _security_group_policy(options: SchedulerOptions) -> list[dict[str, Any]]:
    """The ``SecurityGroupPolicy`` that puts the scheduler pods, and only them, in :attr:`security_group`
    (none with a node selector: the nodes carry it)."""
    if not options.security_group or options.node_selector:
        return []
    return [
        {
            "apiVersion": SECURITY_GROUP_POLICY_API,
            "kind": "SecurityGroupPolicy",
            "metadata": _meta(SCHEDULER_NAME, options.namespace),
            "spec": {
                "podSelector": {"matchLabels": dict(POD_SELECTOR)},
                "securityGroups": {"groupIds": [options.security_group]},
            },
        }
    ]


def scraper_rbac() -> list[dict[str, Any]]:
    """What the AMP managed scraper reads, bound to the user its access entry names (``aps-collector-user``,
    as the AMP documentation sets it up).

    Its scrape configuration (``cdk/prometheus.py``) finds every target with ``kubernetes_sd_configs`` of
    role ``pod`` and nothing else: Prometheus lists and watches pods, and scrapes them by IP. No job reads
    nodes, services, endpoints or the API server's ``/metrics`` (the second scheduler serves its own
    ``/metrics`` anonymously), so none is granted. A ClusterRole, because the namespaces are deploy-time
    choices this module does not know; the scrape itself asks only for the exporters' own.
    """
    name = "gpu-scheduler-aps-collector"
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": _meta(name),
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": _meta(name),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": SCRAPER_USER}],
        },
    ]


def all_manifests(options: SchedulerOptions, *, admission_policy: bool = True) -> list[dict[str, Any]]:
    """The Lambdas' and the scraper's RBAC, the Lambdas' admission policies (Kubernetes 1.30 or newer;
    ``admission_policy=False`` leaves them out) and the second scheduler: everything ``gpu-scheduler.yaml``
    holds."""
    account = f"system:serviceaccount:{options.namespace}:{SCHEDULER_NAME}"
    policies = admission_policies(sharing=options.sharing, scheduler_account=account) if admission_policy else []
    if admission_policy and options.security_group:
        # With a node selector, no SecurityGroupPolicy may name the group: the guard admits none.
        own = "" if options.node_selector else SCHEDULER_NAME
        policies += security_group_policy_guard(options.security_group, options.namespace, own, POD_SELECTOR)
    made = options.sharing and reserving(options.reservation_image)
    image = options.reservation_image
    owners = {RESERVATION_CLASS: RESERVATION_NAMESPACE, PLACEHOLDER_CLASS: PLACEHOLDER_NAMESPACE}
    reservations = (
        [*reservation_manifests(account, image=image), *placeholder_manifests(image, account),
         *share_env_policy(options.share_device), *priority_class_policy(owners)]
        if made
        else []
    )  # fmt: skip
    if made and options.mutating_policy:
        reservations += share_env_mutation(options.mutating_policy, options.share_device)
    if not admission_policy:
        reservations = [doc for doc in reservations if not doc["kind"].startswith("ValidatingAdmission")]
    pools = (
        gpu_nodepools(
            options.karpenter_node_class, sharing=options.sharing, consolidation=options.karpenter_consolidation
        )
        if options.karpenter_node_class
        else []
    )
    return [
        *lambda_rbac(sharing=options.sharing),
        *scraper_rbac(),
        *policies,
        *reservations,
        *scheduler_manifests(options),
        *pools,
    ]


class _Dumper(yaml.SafeDumper):  # type: ignore[misc]
    """Plain YAML for people and kubectl: no ``&id001`` aliases, multi-line strings as ``|`` blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def dump_yaml(document: Any) -> str:
    """One document, keys in the order built and no line folding (a folded token would break CDK)."""
    return str(yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=2**31))


def render_yaml(documents: Sequence[dict[str, Any]], *, header: str = "") -> str:
    """Documents as one multi-document YAML stream."""
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comment + "---\n".join(dump_yaml(doc) for doc in documents)
