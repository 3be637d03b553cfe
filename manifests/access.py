"""The Lambdas' Kubernetes identities: one group per function, its RBAC, and the admission policies that
keep each one to its own labels and annotations.

Each Lambda's IAM role gets an EKS access entry in its own group (``cdk/cluster_access.py``); what the
group may do is exactly the ClusterRole here, and nothing else (no access policy). The verbs are the
calls each function makes (``adapters/kube.py``, ``shares/binder.py`` and the refreshers' services):

| identity | group | verbs |
|---|---|---|
| extender, only with sharing | ``gpu-scheduler:extender`` | pods get, nodes get, pods/binding create |
| node-state refresher | ``gpu-scheduler:node-state`` | nodes list/watch/patch, pods list/watch, DRA list/watch |
| deletion-cost refresher | ``gpu-scheduler:deletion-cost`` | pods list/get/patch, Karpenter's Deployment get |

With sharing, the extender's and node-state groups (and the second scheduler's ServiceAccount) also
create, read and delete reservation pods in their own namespace only (``manifests/reservation.py``,
:func:`~manifests.reservation.keeper_access`), and create or delete placeholders in theirs
(``manifests/placeholder.py``). Nobody gets ``events`` or any write on a resource it does
not own; only the node-state refresher
watches (its watch mode, ``WATCH_S``, on by default: the snapshot a second after each change).
``get`` adds nothing to a ``list`` on the same resource (a list returns every object); the
deletion-cost refresher uses it to re-read one pod after a 409. The extender's bind reads the pod and
its node, then posts a Binding that carries ``gpu-scheduler.io/assigned-gpus`` (the API server copies
a Binding's annotations onto the pod), so it needs no pod patch at all. ``gpu-scheduler serve --watch``
reads DRA's objects as the second scheduler's ServiceAccount, whose built-in ``system:kube-scheduler``
role already reads them wherever the API server serves DRA; nobody here writes any of them. "DRA" above:
``resource.k8s.io`` deviceclasses, resourceslices and resourceclaims.

RBAC cannot say *which* label or annotation a patch may touch. ``admission_policies`` can: four
``ValidatingAdmissionPolicy`` objects (``admissionregistration.k8s.io/v1``, GA in Kubernetes 1.30):

- the node-state group may change only the ``gpu.nvidia.com/model|memory|count`` node labels;
- the deletion-cost group may change only the annotations that carry a pod's cost
  (``controller.kubernetes.io/pod-deletion-cost``, or Karpenter's ``karpenter.sh/disruption-cost``) and
  ``karpenter.sh/do-not-disrupt`` with its owner mark (:data:`COST_ANNOTATIONS`);
- for both, everything else in the object stays as it was: the other labels and annotations, the
  ``spec``, ``ownerReferences`` (an owner that does not exist makes the garbage collector delete the
  object) and ``finalizers`` (one nobody removes keeps it from ever being deleted);
- the extender group's Bindings may carry only the ``assigned-gpus`` annotation;
- nobody else may set, change or remove ``assigned-gpus`` on a pod (``pods/status`` included) or in a
  Binding, but the second scheduler's ServiceAccount, with which ``gpu-scheduler serve`` run beside the
  scheduler binds.

The CEL snippets these share with the product's other policies are in ``manifests/admission.py``; the
policies that keep the product's PriorityClasses and security group to it are in ``manifests/guards.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from manifests.admission import (
    cel_list,
    core_rule,
    denying_policy,
    frozen_list_checks,
    in_group,
    meta,
    metadata_map,
    only_these_change,
)
from scheduler_core.k8s.annotations import BIND_ANNOTATION_SHAPES
from scheduler_core.k8s.names import (
    BIND_ANNOTATIONS,
    CDI_ANNOTATION_PREFIXES,
    DELETION_COST_ANNOTATION,
    DISRUPTION_COST_ANNOTATION,
    DO_NOT_DISRUPT_ANNOTATION,
    DO_NOT_DISRUPT_OWNER,
    DRA_GROUP,
    DRA_OBJECTS,
    LABEL_COUNT,
    LABEL_MEMORY,
    LABEL_MODEL,
    PLACEHOLDER_NAMESPACE,
    RESERVATION_NAMESPACE,
    SCHEDULER_NAME,
)

DEFAULT_SCHEDULER_ACCOUNT = f"system:serviceaccount:kube-system:{SCHEDULER_NAME}"
RBAC = "rbac.authorization.k8s.io"
NODE_LABELS = (LABEL_MODEL, LABEL_MEMORY, LABEL_COUNT)


COST_ANNOTATIONS = (
    DELETION_COST_ANNOTATION,
    DISRUPTION_COST_ANNOTATION,
    DO_NOT_DISRUPT_ANNOTATION,
    DO_NOT_DISRUPT_OWNER,
)
"""What the deletion-cost refresher writes on a managed pod (``docs/deletion-cost.md#under-karpenter``)."""
KARPENTER_DEPLOYMENT_NAME = "karpenter"
"""The Deployment the deletion-cost refresher may read (``KARPENTER_DEPLOYMENT``'s name, the Helm chart's)."""


def _rule(resource: str, *verbs: str, group: str = "") -> dict[str, Any]:
    return {"apiGroups": [group], "resources": [resource], "verbs": list(verbs)}


@dataclass(frozen=True, kw_only=True)
class LambdaIdentity:
    """One function's Kubernetes identity: its group (named by its EKS access entry) and its RBAC rules."""

    name: str
    group: str
    rules: tuple[Mapping[str, Any], ...]

    @property
    def role_name(self) -> str:
        """The ClusterRole and ClusterRoleBinding name."""
        return f"{SCHEDULER_NAME}-{self.name}"


EXTENDER = LambdaIdentity(
    name="extender",
    group="gpu-scheduler:extender",
    # The bind reads the pod (UID, phase, requests) and its node (GPU count, taints), then posts the
    # Binding, which carries the assigned-gpus annotation.
    rules=(_rule("pods", "get"), _rule("nodes", "get"), _rule("pods/binding", "create")),
)
NODE_STATE = LambdaIdentity(
    name="node-state",
    group="gpu-scheduler:node-state",
    # Lists for the snapshot and the reconcile, then a watch of both (WATCH_S); a merge patch of the GPU
    # labels on nodes that changed. DRA's objects, listed and watched for the GPUs that claims hold.
    rules=(
        _rule("nodes", "list", "watch", "patch"),
        _rule("pods", "list", "watch"),
        *(_rule(kind, "list", "watch", group=DRA_GROUP) for kind in DRA_OBJECTS),
    ),
)
DELETION_COST = LambdaIdentity(
    name="deletion-cost",
    group="gpu-scheduler:deletion-cost",
    # Lists the managed pods, patches their cost, re-reads one pod after a 409; reads Karpenter's
    # Deployment (its feature gates: which annotation carries the cost), that one Deployment only.
    rules=(
        _rule("pods", "get", "list", "patch"),
        {**_rule("deployments", "get", group="apps"), "resourceNames": [KARPENTER_DEPLOYMENT_NAME]},
    ),
)


CONSOLIDATOR = LambdaIdentity(
    name="consolidator",
    group="gpu-scheduler:consolidator",
    # Lists what a plan is made from (nodes, pods, PodDisruptionBudgets) and evicts through the Eviction
    # API, which PodDisruptionBudgets hold. No pod write, no delete: an eviction is its only change.
    rules=(
        _rule("nodes", "list"),
        _rule("pods", "list"),
        _rule("poddisruptionbudgets", "list", group="policy"),
        _rule("pods/eviction", "create"),
    ),
)


def identities(*, sharing: bool, consolidation: bool = False) -> tuple[LambdaIdentity, ...]:
    """The identities that get cluster access: the extender only with sharing (it calls Kubernetes only
    to bind), the consolidator only where it is deployed."""
    found = (EXTENDER, NODE_STATE, DELETION_COST) if sharing else (NODE_STATE, DELETION_COST)
    return (*found, CONSOLIDATOR) if consolidation else found


def lambda_rbac(*, sharing: bool, consolidation: bool = False) -> list[dict[str, Any]]:
    """A ClusterRole and its ClusterRoleBinding to the group, per identity with cluster access."""
    docs: list[dict[str, Any]] = []
    for identity in identities(sharing=sharing, consolidation=consolidation):
        docs += [
            {
                "apiVersion": f"{RBAC}/v1",
                "kind": "ClusterRole",
                "metadata": meta(identity.role_name),
                "rules": [dict(rule) for rule in identity.rules],
            },
            {
                "apiVersion": f"{RBAC}/v1",
                "kind": "ClusterRoleBinding",
                "metadata": meta(identity.role_name),
                "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": identity.role_name},
                "subjects": [{"apiGroup": RBAC, "kind": "Group", "name": identity.group}],
            },
        ]
    return docs


# ---- admission policies ---------------------------------------------------------------------------
TRUSTED_NAMESPACE_LABEL = "gpu-scheduler.io/gpu-env"
"""A namespace labelled ``gpu-scheduler.io/gpu-env=trusted``, and ``kube-system``, are exempt from
``manifests.share_env.share_env_policy``'s check on ``NVIDIA_VISIBLE_DEVICES`` and from the ban on CDI
device annotations (:func:`admission_policies`): the NVIDIA device plugin's and the GPU Operator's own
pods set it to ``all`` (label the GPU Operator's namespace before applying the policies, or its pods are
refused on their next restart)."""


TRUSTED_NAMESPACE = (
    "namespaceObject.metadata.name == 'kube-system' || (has(namespaceObject.metadata.labels) && "
    f"'{TRUSTED_NAMESPACE_LABEL}' in namespaceObject.metadata.labels && "
    f"namespaceObject.metadata.labels['{TRUSTED_NAMESPACE_LABEL}'] == 'trusted')"
)
"""CEL: the request's namespace is ``kube-system`` or labelled :data:`TRUSTED_NAMESPACE_LABEL` ``trusted``."""


RESTRICTED = {
    "runAsNonRoot": True,
    "runAsUser": 65534,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
"""The container securityContext of every pod the product creates: Pod Security's ``restricted``."""
POD_RESTRICTED = {
    "runAsNonRoot": True,
    "runAsUser": 65534,
    "runAsGroup": 65534,
    "seccompProfile": {"type": "RuntimeDefault"},
}
"""The pod securityContext of every pod the product creates: ``restricted`` at the pod level too."""
CONTAINER = "object.spec.containers[0]"
"""The one container of a pod the product creates, in a shape policy's expressions."""
_SC = f"{CONTAINER}.securityContext"
_PSC = "object.spec.securityContext"


def _absent(obj: str, *fields: str) -> str:
    return " && ".join(f"!has({obj}.{field})" for field in fields)


POD_SHAPE_CHECKS = (
    ("object.spec.containers.size() == 1", "one container"),
    (
        "(!has(object.spec.initContainers) || object.spec.initContainers.size() == 0) && "
        "(!has(object.spec.ephemeralContainers) || object.spec.ephemeralContainers.size() == 0)",
        "no other containers",
    ),
    (
        f"has({_SC}) && has({_SC}.allowPrivilegeEscalation) && !{_SC}.allowPrivilegeEscalation && "
        f"(!has({_SC}.privileged) || !{_SC}.privileged)",
        "no privilege",
    ),
    (
        f"has({_SC}.runAsNonRoot) && {_SC}.runAsNonRoot && has({_SC}.runAsUser) && {_SC}.runAsUser == 65534 && "
        f"has({_SC}.readOnlyRootFilesystem) && {_SC}.readOnlyRootFilesystem && "
        f"has({_SC}.seccompProfile) && {_SC}.seccompProfile.type == 'RuntimeDefault' && "
        f"has({_SC}.capabilities) && has({_SC}.capabilities.drop) && {_SC}.capabilities.drop == ['ALL'] && "
        f"(!has({_SC}.capabilities.add) || {_SC}.capabilities.add.size() == 0) && "
        f"{_absent(_SC, 'seLinuxOptions', 'windowsOptions', 'appArmorProfile', 'runAsGroup')} && "
        f"(!has({_SC}.procMount) || {_SC}.procMount == 'Default')",
        "the restricted container securityContext (non-root user 65534, read-only root, RuntimeDefault seccomp, "
        "every capability dropped, none added)",
    ),
    (
        f"has({_PSC}) && has({_PSC}.runAsNonRoot) && {_PSC}.runAsNonRoot && has({_PSC}.runAsUser) && "
        f"{_PSC}.runAsUser == 65534 && has({_PSC}.runAsGroup) && {_PSC}.runAsGroup == 65534 && "
        f"has({_PSC}.seccompProfile) && {_PSC}.seccompProfile.type == 'RuntimeDefault' && "
        f"{_absent(_PSC, 'sysctls', 'seLinuxOptions', 'windowsOptions', 'appArmorProfile', 'supplementalGroups')} && "
        f"{_absent(_PSC, 'fsGroup', 'fsGroupChangePolicy', 'seLinuxChangePolicy')}",
        "the restricted pod securityContext (user and group 65534, RuntimeDefault seccomp, nothing else)",
    ),
    (
        f"{_absent(CONTAINER, 'lifecycle', 'livenessProbe', 'readinessProbe', 'startupProbe')} && "
        f"(!has({CONTAINER}.ports) || {CONTAINER}.ports.size() == 0) && !has({CONTAINER}.volumeDevices) && "
        f"(!has({CONTAINER}.resources.claims) || {CONTAINER}.resources.claims.size() == 0)",
        "no lifecycle hooks, probes, ports, devices or resource claims",
    ),
    (
        "!(has(object.spec.hostNetwork) && object.spec.hostNetwork) && !(has(object.spec.hostPID) && "
        "object.spec.hostPID) && !(has(object.spec.hostIPC) && object.spec.hostIPC) && "
        "!(has(object.spec.shareProcessNamespace) && object.spec.shareProcessNamespace)",
        "no host namespaces",
    ),
    (
        "!has(object.spec.runtimeClassName) && "
        "(!has(object.spec.resourceClaims) || object.spec.resourceClaims.size() == 0)",
        "no runtime class and no resource claims",
    ),
)
"""What every pod the product creates must be, checked by its namespace's shape policy: one container, the
restricted securityContext at the pod and container level, nothing that runs code beside its command
(hooks, exec or HTTP probes), no host namespace, port or device, no runtime class, no DRA claim."""


def pod_shape_policy(name: str, namespace: str, kind: str, checks: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """A policy and its binding that admit, in ``namespace``, only pods passing :data:`POD_SHAPE_CHECKS`
    and ``checks`` (CEL expression, what it asks for), whoever creates them; a refusal says "a pod in
    NAMESPACE must be KIND: what"."""
    spec = {
        "matchConstraints": {"resourceRules": [core_rule("pods", "CREATE")]},
        "matchConditions": [{"name": "in-its-namespace", "expression": f"request.namespace == '{namespace}'"}],
        "validations": [
            {"expression": expression, "message": f"a pod in {namespace} must be {kind}: {what}", "reason": "Forbidden"}
            for expression, what in (*POD_SHAPE_CHECKS, *checks)
        ],
    }
    return denying_policy(name, spec)


def _own_writes_only(
    identity: LambdaIdentity, resource: str, field: str, keys: Sequence[str], frozen: str
) -> dict[str, Any]:
    """A policy spec: ``identity``'s updates of ``resource`` change only ``keys`` of ``metadata.field``,
    and leave ``metadata.frozen`` and ``spec`` as they were."""
    return {
        "matchConstraints": {"resourceRules": [core_rule(resource, "UPDATE")]},
        "matchConditions": [{"name": f"is-{identity.name}", "expression": in_group(identity.group)}],
        "variables": [
            {"name": "new", "expression": metadata_map("object", field)},
            {"name": "old", "expression": metadata_map("oldObject", field)},
        ],
        "validations": [
            {
                "expression": only_these_change("variables.new", "variables.old", keys),
                "message": f"{identity.group} may change only {', '.join(keys)} in metadata.{field}",
                "reason": "Forbidden",
            },
            {
                "expression": f"({metadata_map('object', frozen)}) == ({metadata_map('oldObject', frozen)})",
                "message": f"{identity.group} may not change metadata.{frozen}",
                "reason": "Forbidden",
            },
            {
                "expression": "object.spec == oldObject.spec",
                "message": f"{identity.group} may not change spec",
                "reason": "Forbidden",
            },
            *frozen_list_checks(identity.group),
        ],
    }


def _bind_annotations(obj: str, *, when: str = "") -> str:
    """The annotations only the bind writes (:data:`BIND_ANNOTATIONS`) that ``obj`` carries, as a list of
    ``key=value``, or ``[]`` where it has none (or where the condition ``when`` is false; ``&&``
    short-circuits, so ``obj`` is not read then)."""
    guard = f"{when} && " if when else ""
    annotations = f"{obj}.metadata.annotations"
    return (
        f"{guard}has({annotations}) ? {cel_list(BIND_ANNOTATIONS)}.filter(k, k in {annotations})"
        f".map(k, k + '=' + {annotations}[k]) : []"
    )


def _device_annotations(obj: str, *, when: str = "") -> str:
    """The annotations of ``obj`` under :data:`CDI_ANNOTATION_PREFIXES` (a runtime's device requests), as a
    list of ``key=value``, or ``[]`` (as :func:`_bind_annotations`)."""
    guard = f"{when} && " if when else ""
    annotations = f"{obj}.metadata.annotations"
    prefixed = " || ".join(f"k.startsWith('{prefix}')" for prefix in CDI_ANNOTATION_PREFIXES)
    return f"{guard}has({annotations}) ? {annotations}.filter(k, {prefixed}).map(k, k + '=' + {annotations}[k]) : []"


def admission_policies(
    *, sharing: bool, scheduler_account: str = DEFAULT_SCHEDULER_ACCOUNT, consolidation: bool = False
) -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicies and their bindings (Kubernetes 1.30 or newer), in apply order.
    ``scheduler_account`` is the second scheduler's ServiceAccount as a user name, which may write
    ``assigned-gpus`` (``gpu-scheduler serve`` run beside the scheduler binds with it)."""
    docs = denying_policy(
        f"{SCHEDULER_NAME}-node-state-labels",
        _own_writes_only(NODE_STATE, "nodes", "labels", NODE_LABELS, frozen="annotations"),
    )
    docs += denying_policy(
        f"{SCHEDULER_NAME}-deletion-cost-annotation",
        _own_writes_only(DELETION_COST, "pods", "annotations", COST_ANNOTATIONS, frozen="labels"),
    )
    if sharing:
        docs += denying_policy(f"{SCHEDULER_NAME}-extender-bindings", _binders_bindings(scheduler_account))
    # The ledger reconcile and the whole-GPU count trust assigned-gpus, and a share's containers get their
    # GPU from visible-devices: only the extender writes them.
    docs += denying_policy(f"{SCHEDULER_NAME}-assigned-gpus", _bind_annotations_by_binders_only(scheduler_account))
    if consolidation:
        docs += denying_policy(f"{SCHEDULER_NAME}-consolidator-evictions", _consolidator_evictions())
    return docs


PROTECTED_NAMESPACES = ("kube-system", RESERVATION_NAMESPACE, PLACEHOLDER_NAMESPACE)
"""Where the consolidator may evict nothing: the cluster's own pods, and the product's."""


def _consolidator_evictions() -> dict[str, Any]:
    """A policy spec: the consolidator's evictions name the pod's UID (the pod it planned, or none), leave the
    pod its whole termination grace period, and reach no pod of :data:`PROTECTED_NAMESPACES`. RBAC cannot
    say any of it: ``pods/eviction`` ``create`` is all or nothing."""
    options = "has(object.deleteOptions)"
    return {
        "matchConstraints": {"resourceRules": [core_rule("pods/eviction", "CREATE")]},
        "matchConditions": [{"name": "is-the-consolidator", "expression": in_group(CONSOLIDATOR.group)}],
        "validations": [
            {
                "expression": f"{options} && has(object.deleteOptions.preconditions) && "
                "has(object.deleteOptions.preconditions.uid) && object.deleteOptions.preconditions.uid != ''",
                "message": "the consolidator evicts a pod by its UID (deleteOptions.preconditions.uid)",
                "reason": "Forbidden",
            },
            {
                "expression": f"!{options} || !has(object.deleteOptions.gracePeriodSeconds)",
                "message": "the consolidator may not shorten a pod's termination grace period",
                "reason": "Forbidden",
            },
            {
                "expression": f"!(request.namespace in {cel_list(PROTECTED_NAMESPACES)})",
                "message": f"the consolidator evicts no pod in {', '.join(PROTECTED_NAMESPACES)}",
                "reason": "Forbidden",
            },
        ],
    }


def _binders_bindings(scheduler_account: str) -> dict[str, Any]:
    """A policy spec: the Bindings of the extender's group and of ``scheduler_account`` carry no annotation
    but :data:`BIND_ANNOTATIONS`, each of the bind's shape (``BIND_ANNOTATION_SHAPES``)."""
    binder = f"{in_group(EXTENDER.group)} || request.userInfo.username == '{scheduler_account}'"
    shapes = " && ".join(
        f"(!('{key}' in variables.annotations) || variables.annotations['{key}'].matches('{pattern}'))"
        for key, pattern in BIND_ANNOTATION_SHAPES.items()
    )
    return {
        "matchConstraints": {"resourceRules": [core_rule("pods/binding", "CREATE")]},
        "matchConditions": [{"name": "is-a-binder", "expression": binder}],
        "variables": [{"name": "annotations", "expression": metadata_map("object", "annotations")}],
        "validations": [
            {
                "expression": f"variables.annotations.all(k, k in {cel_list(BIND_ANNOTATIONS)})",
                "message": f"Bindings may carry no annotation but {', '.join(BIND_ANNOTATIONS)}",
                "reason": "Forbidden",
            },
            {
                "expression": shapes,
                "message": (
                    "a Binding's gpu-scheduler annotations must be of the bind's shapes (GPU index:milli "
                    "pairs, a GPU UUID, its CDI device, the share's size)"
                ),
                "reason": "Invalid",
            },
        ],
    }


def _bind_annotations_by_binders_only(scheduler_account: str) -> dict[str, Any]:
    """A policy spec: nobody but the extender's group and ``scheduler_account`` sets, changes or removes
    :data:`BIND_ANNOTATIONS` on a pod (``pods/status`` included) or in a Binding, nor any CDI device
    annotation outside a trusted namespace (:data:`TRUSTED_NAMESPACE`)."""
    return {
        "matchConstraints": {
            "resourceRules": [
                core_rule("pods", "CREATE", "UPDATE"),
                core_rule("pods/status", "UPDATE"),
                core_rule("pods/binding", "CREATE"),
            ]
        },
        "matchConditions": [
            {"name": "not-the-extender", "expression": f"!({in_group(EXTENDER.group)})"},
            {"name": "not-the-scheduler", "expression": f"request.userInfo.username != '{scheduler_account}'"},
        ],
        "variables": [
            {"name": "assigned", "expression": _bind_annotations("object")},
            # oldObject is null on CREATE: only read on UPDATE (&& short-circuits).
            {
                "name": "oldAssigned",
                "expression": _bind_annotations("oldObject", when="request.operation == 'UPDATE'"),
            },
            {"name": "devices", "expression": _device_annotations("object")},
            {
                "name": "oldDevices",
                "expression": _device_annotations("oldObject", when="request.operation == 'UPDATE'"),
            },
        ],
        "validations": [
            {
                "expression": (
                    "request.operation == 'UPDATE' ? variables.assigned == variables.oldAssigned "
                    ": size(variables.assigned) == 0"
                ),
                "message": f"only the gpu-scheduler extender may set, change or remove {', '.join(BIND_ANNOTATIONS)}",
                "reason": "Forbidden",
            },
            {
                # A container runtime may inject any device these name (docs/sharing.md): a tenant who could
                # write one would take a GPU nobody gave it. kube-system and namespaces labelled trusted
                # (a cluster administrator's) keep their own.
                "expression": (
                    f"({TRUSTED_NAMESPACE}) || (request.operation == 'UPDATE' ? "
                    "variables.devices == variables.oldDevices : size(variables.devices) == 0)"
                ),
                "message": (
                    f"only the gpu-scheduler extender may give a pod CDI devices (annotations "
                    f"{' and '.join(p + '*' for p in CDI_ANNOTATION_PREFIXES)})"
                ),
                "reason": "Forbidden",
            },
        ],
    }
