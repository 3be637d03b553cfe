"""What the second scheduler's manifests depend on: :class:`SchedulerOptions`, every option defaulted and
every invalid one named at once (:meth:`SchedulerOptions.problems`), and the ``--node-selector`` items
parsed. ``manifests.scheduler_configuration`` and ``manifests.scheduler`` build from a validated one."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from manifests.nodepool import CONSOLIDATION_POLICIES
from manifests.reservation import DEFAULT_IMAGE as RESERVATION_IMAGE
from manifests.reservation import image_problems
from manifests.share_env import MUTATING_APIS
from scheduler_core.errors import Validatable
from scheduler_core.k8s.names import SHARE_DEVICES

# kube-scheduler must not be newer than the API server: set the tag to the cluster's minor version.
DEFAULT_IMAGE = "registry.k8s.io/kube-scheduler:v1.33.5"
BIND_HTTP_TIMEOUT_S = 15.0
"""The bind's ``httpTimeout`` with reservation pods: the bind's own budget (2.5 s), the wait for a new
GPU's reservation pod to report its UUID (``manifests.reservation.UUID_WAIT_S``, 10 s), and a margin.
Under API Gateway's 29 s."""


@dataclass(frozen=True, kw_only=True)
class SchedulerOptions(Validatable):
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
    consolidation: bool = False
    """The consolidator's identity: its RBAC and the admission policy over its evictions
    (:data:`manifests.access.CONSOLIDATOR`)."""
    node_cache_capable: bool = True
    weight: int = 5
    http_timeout_s: float = 3.0
    bind_http_timeout_s: float = BIND_HTTP_TIMEOUT_S
    """With sharing and reservation pods: the bind's own ``httpTimeout``
    (:func:`manifests.scheduler_configuration.extender_entries`)."""
    image: str = DEFAULT_IMAGE
    namespace: str = "kube-system"
    replicas: int = 2
    client_qps: int = 100
    client_burst: int = 200
    bin_pack: bool = True
    """The profile's NodeResourcesFit scores by MostAllocated, GPUs included: where the extender sees
    no difference, kube-scheduler packs instead of spreading
    (see :func:`manifests.scheduler_configuration.profile`)."""
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


_DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
"""A Kubernetes object name (DNS subdomain)."""
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}")
_LABEL_VALUE = re.compile(rf"({_LABEL_NAME})?")
MAX_NODE_SELECTOR = 8
_SECURITY_GROUP = re.compile(r"sg-[0-9a-f]{8}(?:[0-9a-f]{9})?")
_TOKEN = re.compile(r"\$\{Token\[[A-Za-z0-9_.-]+\]\}")
"""A CDK token: a security group the stack makes, known after deploy."""


def _loopback_http(url: str) -> bool:
    """``http://`` to this host only: a request in the clear never leaves the pod or the machine.

    >>> _loopback_http("http://127.0.0.1:8888"), _loopback_http("http://10.0.0.5:8888")
    (True, False)
    """
    parsed = urllib.parse.urlsplit(url)
    return parsed.scheme == "http" and parsed.hostname in ("127.0.0.1", "localhost", "::1")


def parse_node_selector(items: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """``key=value`` items as a node selector, and the items without ``=`` (for the caller to name); the
    keys and values themselves are :meth:`SchedulerOptions.problems`' to check.

    >>> parse_node_selector(["role=scheduler", "pool"])
    ({'role': 'scheduler'}, ['pool'])
    """
    pairs = [item.partition("=") for item in items]
    return {key: value for key, equals, value in pairs if equals}, [key for key, equals, _ in pairs if not equals]
