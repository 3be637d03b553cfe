"""Extender settings: read once from the environment (the Lambda) or from flags (``gpu-scheduler serve``)
into a frozen dataclass.

Each field is declared once, with ``adapters.settings.setting``: its variable, its default, its doc, and
where they differ from the field's name its flag and its CDK context key. From that declaration come the
reference table in ``docs/configuration.md``, ``serve``'s flags (and the score flags of ``explain``), and
the CDK app's defaults, validation and Lambda environment for the keys it passes on (``cdk/config.py``,
``cdk/stack.py``). :meth:`ExtenderSettings.problems` is the validation for all of them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

from adapters.metric_catalogue import EXTENDER, NAMESPACE
from adapters.settings import ClusterAccess, env_names, setting
from adapters.snapshot_store import DEFAULT_MAX_AGE_S, DEFAULT_REFRESH_S
from manifests.reservation import DEFAULT_IMAGE as RESERVATION_IMAGE
from manifests.reservation import image_problems
from scheduler_core.errors import Namer
from scheduler_core.extender.facade import ExtenderConfig
from scheduler_core.k8s.names import SHARE_DEVICES
from scheduler_core.scoring.gpu_fit import ScoreWeights
from scheduler_core.scoring.locality import DEFAULT_LABEL_KEYS, LocalitySettings
from scheduler_core.scoring.policy import DEFAULT_SHARE_POLICY, SHARE_POLICIES

LAMBDA_MAX_BODY_BYTES = 6 * 2**20
CORE_FIELDS = {
    **{f"weights.{name}": f"weight_{name}" for name in ("fit", "utilization", "locality")},
    **{f"locality.{name}": f"locality_{name}" for name in ("label_keys", "zone_alpha", "zone_values", "self_weight")},
    "max_body_bytes": "max_body_bytes",
    "share_policy": "share_policy",
}
"""The setting behind each path of the core's :class:`~scheduler_core.extender.facade.ExtenderConfig`, as
:meth:`ExtenderSettings._config` builds it: how its checks are named in this class's words."""
ENV_DEVICE_WARNING = (
    "SHARE_DEVICE=env: shares get their GPU through NVIDIA_VISIBLE_DEVICES, which the NVIDIA container toolkit "
    "must then accept from unprivileged containers; any pod on a GPU node that sets it through envFrom or its "
    "image's config sees every GPU it names (docs/sharing.md#from-pod-to-container-the-gpu-and-the-shares-size). "
    "Use SHARE_DEVICE=cdi."
)
CDI_RUNTIME = (
    "SHARE_DEVICE=cdi: a share's GPU reaches its containers as the CDI device its Binding names in "
    "nvidia.cdi.k8s.io/pod. The GPU nodes need the NVIDIA toolkit's NRI plugin (GPU Operator >= v26.3: "
    "cdi.enabled, cdi.nriPluginEnabled), containerd >= 2.1, the device plugin with a CDI strategy, and "
    "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED=false (docs/sharing.md#runtime-settings-a-cluster-needs)."
)
"""What the generated manifests' header says a cluster's GPU nodes need, with sharing and ``cdi``."""


@dataclass(frozen=True)
class ExtenderSettings(ClusterAccess):
    """The extender's settings (:meth:`~adapters.settings.ClusterAccess.from_env`).

    >>> ExtenderSettings.from_env({"SNAPSHOT_URI": "s3://b/k"}, max_snapshot_age_s=60).max_snapshot_age_s
    60
    """

    snapshot_uri: str = setting(
        "SNAPSHOT_URI",
        "",
        "`s3://bucket/key`, `file:///path` or a path; without it `NodeNames` is refused",
        flag="--snapshot",
    )
    snapshot_refresh_s: float = setting(
        "SNAPSHOT_REFRESH_S",
        DEFAULT_REFRESH_S,
        "re-check the snapshot's ETag at most this often (304 if unchanged)",
        flag="--refresh-s",
    )
    max_snapshot_age_s: float = setting(
        "MAX_SNAPSHOT_AGE_S",
        DEFAULT_MAX_AGE_S,
        "refuse (filter `Error`) a snapshot older than this",
        context="maxSnapshotAgeS",
    )
    holds_uri: str = setting(
        "HOLDS_URI",
        "",
        "the consolidator's holds (`s3://bucket/key`, `file:///path` or a path), obeyed by filter; empty: none",
        flag="--holds",
    )
    max_body_bytes: int = setting(
        "MAX_BODY_BYTES", LAMBDA_MAX_BODY_BYTES, "largest request body (Lambda's own limit is 6 MB)"
    )
    weight_fit: float = setting("SCORE_WEIGHT_FIT", ScoreWeights.fit, "best-fit weight")
    weight_utilization: float = setting("SCORE_WEIGHT_UTILIZATION", ScoreWeights.utilization, "low-utilisation weight")
    weight_locality: float = setting(
        "SCORE_WEIGHT_LOCALITY", ScoreWeights.locality, "network-locality weight (pods with `gpu-scheduler.io/peers`)"
    )
    locality_label_keys: str = setting(
        "LOCALITY_LABEL_KEYS", ",".join(DEFAULT_LABEL_KEYS), "label keys peers may select on"
    )
    locality_zone_alpha: float = setting(
        "LOCALITY_ZONE_ALPHA",
        LocalitySettings.zone_alpha,
        "value of a peer pod in the same zone, on another node",
        flag="--zone-alpha",
    )
    locality_zone_values: str = setting(
        "LOCALITY_ZONE_VALUES", "", "JSON `{zone: {zone: value}}` replacing the same-zone/other-zone steps"
    )
    locality_self_weight: float = setting(
        "LOCALITY_SELF_WEIGHT", LocalitySettings.self_weight, "weight of a pod's own workload among its peers (0: off)"
    )
    share_policy: str = setting(
        "SHARE_POLICY",
        DEFAULT_SHARE_POLICY,
        f"places pods: one of {', '.join(f'`{p}`' for p in SHARE_POLICIES)}",
        context="sharePolicy",
    )
    ledger_table: str = setting(
        "LEDGER_TABLE", "", "the GPU ledger's DynamoDB table; with it, `/bind` and `/preempt` are served"
    )
    reservation_image: str = setting(
        "RESERVATION_IMAGE",
        RESERVATION_IMAGE,
        "with `LEDGER_TABLE`: the image of the reservation pod that holds each GPU shares are bound to, in "
        "Kubernetes' own count (docs/sharing.md); `none`: no reservation pods",
        context="reservationImage",
    )
    share_device: str = setting(
        "SHARE_DEVICE",
        "cdi",
        "with `LEDGER_TABLE`: how a share's GPU reaches its containers. `cdi`: a CDI device named in the "
        "Binding, which no tenant may write (docs/sharing.md says how to set up the runtime); `env`: "
        "`NVIDIA_VISIBLE_DEVICES` read from the Binding's annotation, which needs the NVIDIA toolkit to take "
        "that variable from any unprivileged container: every pod on a GPU node can then name every GPU there",
        context="shareDevice",
    )
    metrics_namespace: str = setting(
        "POWERTOOLS_METRICS_NAMESPACE", NAMESPACE, "CloudWatch namespace of the EMF metrics"
    )
    service: str = setting("POWERTOOLS_SERVICE_NAME", EXTENDER, "service name in logs, metrics and traces")

    def problems(self, name: Namer | None = None) -> list[str]:
        """Every invalid setting, each named by ``name`` of its field (its variable by default)."""
        name = name or env_names(type(self))
        found = []
        for field_name in ("snapshot_refresh_s", "max_snapshot_age_s"):
            value = getattr(self, field_name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                found.append(f"{name(field_name)}: must be a non-negative number of seconds, got {value!r}")
        for key in ("snapshot_uri", "holds_uri"):
            uri = getattr(self, key)
            if "://" in uri and not uri.startswith(("s3://", "file://")):
                found.append(f"{name(key)}: expected s3://bucket/key, file:///path or a path, got {uri!r}")

        def core(path: str) -> str:  # the core's checks name its own paths: each is one of these fields
            return name(CORE_FIELDS[path])

        try:
            found += self._config().problems(core)
        except ValueError as exc:  # the zone values are not JSON of the right shape: check the rest without them
            found += [f"{core('locality.zone_values')}: {exc}", *self._config(zone_values=False).problems(core)]
        if self.ledger_table:
            found.extend(problem + " (bind needs the API)" for problem in self.access_problems(name))
        found += image_problems(name("reservation_image"), self.reservation_image)
        if self.share_device not in SHARE_DEVICES:
            device = self.share_device
            found.append(f"{name('share_device')}: expected one of {', '.join(SHARE_DEVICES)}, got {device!r}")
        return found

    @property
    def env_device_warning(self) -> str:
        """What to log at start-up when shares get their GPU through ``NVIDIA_VISIBLE_DEVICES`` ("" when not)."""
        if not (self.ledger_table and self.share_device == "env"):
            return ""
        return ENV_DEVICE_WARNING

    def score_weights(self) -> ScoreWeights:
        return ScoreWeights(fit=self.weight_fit, utilization=self.weight_utilization, locality=self.weight_locality)

    def locality_settings(self) -> LocalitySettings:
        """Raises ValueError when ``locality_zone_values`` is not a JSON object of objects."""
        zone_values = None
        if self.locality_zone_values:
            zone_values = json.loads(self.locality_zone_values)
            if not isinstance(zone_values, dict) or not all(isinstance(row, dict) for row in zone_values.values()):
                raise ValueError("expected a JSON object mapping each zone to an object of zone: value")
        keys = tuple(key.strip() for key in self.locality_label_keys.split(",") if key.strip())
        return LocalitySettings(
            label_keys=keys,
            zone_alpha=self.locality_zone_alpha,
            zone_values=zone_values,
            self_weight=self.locality_self_weight,
        )

    def extender_config(self) -> ExtenderConfig:
        """The core's settings (checked when these were loaded: :meth:`problems`)."""
        return self._config().validated()

    def _config(self, *, zone_values: bool = True) -> ExtenderConfig:
        """Raises ValueError as :meth:`locality_settings` does (never without ``zone_values``)."""
        settings = self if zone_values else replace(self, locality_zone_values="")
        return ExtenderConfig(
            weights=settings.score_weights(),
            max_body_bytes=settings.max_body_bytes,
            locality=settings.locality_settings(),
            share_policy=settings.share_policy,
        )
