"""Every Kubernetes name the scheduler reads or writes: resources, labels, annotations, the profile.

One place, so that a label is spelled once and a grep finds every reader.
"""

from __future__ import annotations

MILLI_PER_GPU = 1000
"""Thousandths of one GPU: ``gpu-scheduler.io/gpu-milli`` counts in them, and 1000 is a whole GPU."""

SCHEDULER_NAME = "gpu-scheduler"
"""The second scheduler's profile: pods opt in with ``spec.schedulerName: gpu-scheduler``."""

# Extended resources.
GPU_RESOURCE = "nvidia.com/gpu"
MILLI_RESOURCE = "gpu-scheduler.io/gpu-milli"
"""Fractional GPUs, 1000 per GPU: kube-scheduler ignores it (NodeResourcesFit's ``ignoredResources`` in
the generated profile), and the extender's bind accounts it."""

# Node labels the node-state refresher writes (from EC2 instance-type data).
LABEL_MODEL = "gpu.nvidia.com/model"
LABEL_MEMORY = "gpu.nvidia.com/memory"
LABEL_COUNT = "gpu.nvidia.com/count"
# NVIDIA GPU Feature Discovery's labels: they win over the project's, fact by fact.
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"
GFD_COUNT = "nvidia.com/gpu.count"
# MIG: the GPU Operator's MIG manager says where a reconfiguration stands; GFD's product names the slice.
MIG_CONFIG_STATE = "nvidia.com/mig.config.state"
MIG_BUSY_STATES = frozenset({"pending", "rebooting", "failed"})
"""``nvidia.com/mig.config.state`` values of a node whose GPUs are not what its labels say: the MIG manager
is changing them (``pending``, ``rebooting``) or could not (``failed``). ``success`` is settled."""
MIG_INVALID_SUFFIX = "-MIG-INVALID"
"""GFD's ``nvidia.com/gpu.product`` ending with the ``single`` strategy when the GPUs' MIG layouts differ."""
MIG_STRATEGY = "nvidia.com/mig.strategy"
"""GFD's label for the device plugin's MIG strategy: ``single`` or ``mixed`` (:mod:`scheduler_core.k8s.mig`)."""
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
"""The ``mixed`` strategy's resources, one per profile: ``nvidia.com/mig-1g.18gb``."""
ACCEPT_MIG_ANNOTATION = "gpu-scheduler.io/accept-mig-slices"
"""``"true"`` on a pod that asks ``nvidia.com/gpu`` and accepts a MIG slice for each (``single`` nodes)."""
# Dynamic Resource Allocation (scheduler_core/k8s/dra.py).
DRA_GROUP = "resource.k8s.io"
DRA_VERSIONS = ("v1", "v1beta2", "v1beta1")
"""The ``resource.k8s.io`` versions the product reads, the preferred first: ``v1`` (1.34, GA),
``v1beta2`` (1.33) and ``v1beta1`` (1.32, whose devices wrap their attributes in ``basic``)."""
DRA_OBJECTS = ("deviceclasses", "resourceslices", "resourceclaims")
"""The DRA objects the state reads (list and watch)."""
DRA_GPU_DRIVER = "gpu.nvidia.com"
"""NVIDIA's DRA driver for GPUs (``kubernetes-sigs/dra-driver-nvidia-gpu``): its devices are GPUs, MIG
devices and passthrough GPUs (attribute ``type``: ``gpu``, ``mig``, ``vfio``)."""
# Karpenter's AWS provider labels a node, and an instance type before it launches one, with its GPUs
# (aws/karpenter-provider-aws computeRequirements; scheduler_core/k8s/autoscaler.py has the table).
KARPENTER_GPU_NAME = "karpenter.k8s.aws/instance-gpu-name"
KARPENTER_GPU_MANUFACTURER = "karpenter.k8s.aws/instance-gpu-manufacturer"
KARPENTER_GPU_COUNT = "karpenter.k8s.aws/instance-gpu-count"
KARPENTER_GPU_MEMORY = "karpenter.k8s.aws/instance-gpu-memory"
KARPENTER_NODEPOOL = "karpenter.sh/nodepool"
# Well-known labels.
LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
LABEL_HOSTNAME = "kubernetes.io/hostname"
DAEMON_LABEL = "pod-template-generation"
"""The label the DaemonSet controller puts on every pod it creates (``DaemonSetTemplateGenerationKey``)."""


# Pod annotations. The model and memory annotations share the node labels' keys.
ASSIGNED_GPUS_ANNOTATION = "gpu-scheduler.io/assigned-gpus"
"""Written by the bind: where a pod's share of a GPU went, as ``index:milli`` pairs."""
# Written by the bind on a share, for its containers' environment (manifests/share_env.py).
VISIBLE_DEVICES_ANNOTATION = "gpu-scheduler.io/visible-devices"
"""The UUID of the GPU a share is on, as its reservation pod reported it."""
GPU_PORTION_ANNOTATION = "gpu-scheduler.io/gpu-portion"
MPS_THREADS_ANNOTATION = "gpu-scheduler.io/mps-thread-percentage"
MPS_MEMORY_ANNOTATION = "gpu-scheduler.io/mps-memory-limit"
CDI_DEVICE_ANNOTATION = "nvidia.cdi.k8s.io/pod"
"""The CDI devices every container of a pod is given: the NVIDIA container toolkit's NRI plugin reads it from
the pod and has containerd inject them (``docs/sharing.md``, "From pod to container"). The bind writes a
share's GPU there, in the Binding; no tenant may write any key of :data:`CDI_ANNOTATION_PREFIXES`."""
CDI_DEVICE_KIND = "k8s.device-plugin.nvidia.com/gpu"
"""The CDI kind of the GPUs the NVIDIA device plugin publishes with a CDI strategy (device names are UUIDs)."""
CDI_ANNOTATION_PREFIXES = ("cdi.k8s.io/", "nvidia.cdi.k8s.io/")
"""Pod annotation prefixes a container runtime may read devices from: CDI's own (containerd's ``pod_annotations``
pass-through to the NVIDIA runtime) and the toolkit's NRI plugin's."""
SHARE_DEVICES = ("cdi", "env")
"""How a share's GPU reaches its containers: a CDI device in :data:`CDI_DEVICE_ANNOTATION` (no tenant can
write it), or ``NVIDIA_VISIBLE_DEVICES`` read from :data:`VISIBLE_DEVICES_ANNOTATION` (which needs the
toolkit to accept that variable from unprivileged containers: any container can then name any GPU)."""
BIND_ANNOTATIONS = (
    ASSIGNED_GPUS_ANNOTATION,
    VISIBLE_DEVICES_ANNOTATION,
    GPU_PORTION_ANNOTATION,
    MPS_THREADS_ANNOTATION,
    MPS_MEMORY_ANNOTATION,
    CDI_DEVICE_ANNOTATION,
)
"""What only the bind writes, in the Binding (``manifests.access``'s ``gpu-scheduler-assigned-gpus`` policy)."""
PEERS_ANNOTATION = "gpu-scheduler.io/peers"
"""Label selectors of the workloads a pod talks to, with traffic weights (network locality)."""

# Pod deletion cost.
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
DISRUPTION_COST_ANNOTATION = "karpenter.sh/disruption-cost"
"""Karpenter's own cost of evicting a pod, read instead of the one above where its ``PodDeletionCostManagement``
gate is on (:mod:`scheduler_core.deletion_cost.karpenter`)."""
DO_NOT_DISRUPT_ANNOTATION = "karpenter.sh/do-not-disrupt"
"""``"true"``: Karpenter's consolidation, drift and expiry leave the pod's node alone while it runs."""
DO_NOT_DISRUPT_OWNER = "gpu-scheduler.io/do-not-disrupt"
"""Beside a ``karpenter.sh/do-not-disrupt`` the deletion-cost refresher wrote: the one it may take away again."""
DELETION_COST_LABEL = "gpu-scheduler.io/deletion-cost"
MANAGED_SELECTOR = f"{DELETION_COST_LABEL}=managed"
"""Pods opt in to deletion-cost management with this label; no other pod is read or written."""

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

# Consolidation (scheduler_core/consolidation/): which pods it may move, and which it never moves.
MOVABLE_LABEL = "gpu-scheduler.io/movable"
"""Pods opt in to being moved by the consolidator with this label set to ``"true"`` (their controller's
template carries it, so a replacement is movable too)."""
SAFE_TO_EVICT_ANNOTATION = "cluster-autoscaler.kubernetes.io/safe-to-evict"
"""``"false"``: Cluster Autoscaler never evicts the pod; the consolidator never moves it either."""

# GPU reservation (a pod per shared GPU, so that Kubernetes counts it: manifests/reservation.py).
RESERVATION_NAMESPACE = "gpu-scheduler-reservations"
RESERVATION_APP = "gpu-reservation"
"""The ``app.kubernetes.io/name`` of a reservation pod, and of the ServiceAccount it runs as."""
RESERVATION_SLOT_LABEL = "gpu-scheduler.io/slot"
"""On a reservation pod: the GPU (the ledger's index on its node) whose shares it holds the GPU for."""
RESERVED_GPU_ANNOTATION = "gpu-scheduler.io/reserved-gpu"
"""Written by a reservation pod on itself: the UUID of the GPU the device plugin gave it."""
# Placeholders: whole-GPU pods standing for shares that fit nowhere, for autoscalers (manifests/placeholder.py).
PLACEHOLDER_NAMESPACE = "gpu-scheduler-placeholders"
PLACEHOLDER_APP = "gpu-placeholder"
PLACEHOLDER_GROUP_LABEL = "gpu-scheduler.io/placeholder-group"
"""On a placeholder pod: the digest of its shares' node requirements (:mod:`scheduler_core.state.demand`)."""
