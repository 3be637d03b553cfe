"""Kubernetes manifests for the second scheduler and for the Lambdas' cluster access.

One source for both ways out: the CDK app writes them to ``cdk.out/manifests/gpu-scheduler.yaml`` (and
applies them through ``aws_eks_v2`` when asked), and ``gpu-scheduler scheduler-config`` writes the same
documents for a URL given on the command line.

What is generated (:func:`all_manifests`, from one :class:`~manifests.scheduler_options.SchedulerOptions`):

- ``manifests.access``: one ClusterRole per Lambda's Kubernetes group (EKS access entries map each IAM
  role onto its own group), with the least verbs each uses, and the ValidatingAdmissionPolicies that keep
  each identity to its own labels and annotations.
- ``scheduler_manifests``, here: the upstream kube-scheduler running as a second scheduler named
  ``gpu-scheduler``: ServiceAccount, the RBAC it needs, a ConfigMap with its ``KubeSchedulerConfiguration``
  (``kubescheduler.config.k8s.io/v1``, ``manifests.scheduler_configuration``, which says the choices that
  matter) calling our extender, a Deployment with probes, and a PDB.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import yaml

from manifests.access import admission_policies, lambda_rbac
from manifests.guards import priority_class_policy, security_group_policy_guard
from manifests.nodepool import gpu_nodepools
from manifests.placeholder import NAMESPACE as PLACEHOLDER_NAMESPACE
from manifests.placeholder import PRIORITY_CLASS as PLACEHOLDER_CLASS
from manifests.placeholder import placeholder_manifests
from manifests.reservation import NAMESPACE as RESERVATION_NAMESPACE
from manifests.reservation import PRIORITY_CLASS as RESERVATION_CLASS
from manifests.reservation import reservation_manifests, reserving
from manifests.scheduler_configuration import break_glass_configuration, scheduler_configuration
from manifests.scheduler_options import SchedulerOptions
from manifests.share_env import share_env_mutation, share_env_policy
from scheduler_core.k8s.names import SCHEDULER_NAME

# The Kubernetes user the AMP managed scraper's role is mapped to.
SCRAPER_USER = "aps-collector-user"
CONFIG_PATH = "/etc/kubernetes/gpu-scheduler"
CONFIG_FILE = "config.yaml"
BREAK_GLASS_FILE = "break-glass.yaml"
CONFIG_ENV = "GPU_SCHEDULER_CONFIG"
"""The Deployment's variable that names which of the ConfigMap's two configurations kube-scheduler reads:
``config.yaml`` (the extender's), or ``break-glass.yaml`` (none:
:func:`~manifests.scheduler_configuration.break_glass_configuration`).
``kubectl -n kube-system set env deployment/gpu-scheduler GPU_SCHEDULER_CONFIG=break-glass.yaml`` rolls the
pods onto it; ``=config.yaml`` back (docs/deploy.md#the-way-back)."""
SECURE_PORT = 10259
CONFIG_HASH_ANNOTATION = "gpu-scheduler.io/config-sha256"
EXTENDER_URL_ANNOTATION = "gpu-scheduler.io/extender-url"
"""On the scheduler's pod template beside the digest: the URL in its configuration, which the CDK app knows
only as a deploy-time value, so that a new URL rolls the pods too."""
_LABELS = {"app.kubernetes.io/name": SCHEDULER_NAME, "app.kubernetes.io/part-of": "eks-gpu-scheduler"}
POD_SELECTOR = {"app.kubernetes.io/name": SCHEDULER_NAME}
"""The scheduler's pods, and only them: the Deployment's selector, its PDB's, and its SecurityGroupPolicy's
(which ``gpu-scheduler-security-group`` holds to exactly this)."""
SECURITY_GROUP_POLICY_API = "vpcresources.k8s.aws/v1beta1"
"""The VPC resource controller's ``SecurityGroupPolicy`` (EKS runs the controller; the VPC CNI needs
``ENABLE_POD_ENI=true`` and the nodes a trunk interface)."""


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


def scheduler_manifests(
    options: SchedulerOptions, *, stable_text: Callable[[str], str] | None = None
) -> list[dict[str, Any]]:
    """Every document for the second scheduler, in apply order.

    The pods roll when their configuration changes: the Deployment's pod template carries the digest of
    the configurations' text and the extender's URL. ``stable_text`` maps that text to what the digest is
    taken of: the CDK app's text holds a deploy-time URL whose placeholder changes from one synth to the
    next, and it passes a function that writes the placeholder as the reference it stands for; the URL
    annotation, resolved at deploy time, rolls the pods when the API's URL changes.

    >>> docs = scheduler_manifests(SchedulerOptions(extender_url="https://x.example/prod"))
    >>> [d["kind"] for d in docs][-3:]
    ['ConfigMap', 'Deployment', 'PodDisruptionBudget']
    """
    options.validated()
    ns = options.namespace
    config_text = dump_yaml(scheduler_configuration(options))
    break_glass_text = dump_yaml(break_glass_configuration(options))
    digested = config_text + break_glass_text
    config_hash = hashlib.sha256((stable_text or str)(digested).encode()).hexdigest()[:16]
    selector = dict(POD_SELECTOR)
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
        _deployment(options, config_hash, selector),
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": _meta(SCHEDULER_NAME, ns),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector}},
        },
    ]


def _deployment(options: SchedulerOptions, config_hash: str, selector: dict[str, str]) -> dict[str, Any]:
    """The scheduler's Deployment: :func:`_container` with the ConfigMap mounted, its pods (``selector``)
    spread over nodes, and annotated with ``config_hash``, the configurations' digest."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(SCHEDULER_NAME, options.namespace),
        "spec": {
            "replicas": options.replicas,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {
                    "labels": dict(_LABELS),
                    # kube-scheduler reads its configuration once: a new text rolls the pods.
                    "annotations": {CONFIG_HASH_ANNOTATION: config_hash, EXTENDER_URL_ANNOTATION: options.extender_url},
                },
                "spec": {
                    "serviceAccountName": SCHEDULER_NAME,
                    "priorityClassName": "system-cluster-critical",
                    "containers": [_container(options)],
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


def _container(options: SchedulerOptions) -> dict[str, Any]:
    """The kube-scheduler container: the configuration :data:`CONFIG_ENV` names, its image's feature gates
    (:func:`feature_gates`), probes on the secure port, and the restricted securityContext."""
    probe = {"httpGet": {"path": "/healthz", "port": SECURE_PORT, "scheme": "HTTPS"}}
    return {
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


def _placement(node_selector: Mapping[str, str]) -> dict[str, Any]:
    """The pod spec's ``nodeSelector`` and the tolerations of those keys' taints, for the scheduler pods on a
    node group of their own (nothing without one)."""
    if not node_selector:
        return {}
    return {
        "nodeSelector": dict(node_selector),
        "tolerations": [{"key": key, "operator": "Exists"} for key in sorted(node_selector)],
    }


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


def all_manifests(
    options: SchedulerOptions, *, admission_policy: bool = True, stable_text: Callable[[str], str] | None = None
) -> list[dict[str, Any]]:
    """The Lambdas' and the scraper's RBAC, the Lambdas' admission policies (Kubernetes 1.30 or newer;
    ``admission_policy=False`` leaves them out) and the second scheduler (:func:`scheduler_manifests`, with
    ``stable_text``): everything ``gpu-scheduler.yaml`` holds."""
    account = f"system:serviceaccount:{options.namespace}:{SCHEDULER_NAME}"
    policies = (
        admission_policies(sharing=options.sharing, scheduler_account=account, consolidation=options.consolidation)
        if admission_policy
        else []
    )
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
        *lambda_rbac(sharing=options.sharing, consolidation=options.consolidation),
        *scraper_rbac(),
        *policies,
        *reservations,
        *scheduler_manifests(options, stable_text=stable_text),
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
