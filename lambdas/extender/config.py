"""Extender Lambda settings: read once from the environment into a frozen dataclass.

| variable | default | meaning |
|---|---|---|
| ``SNAPSHOT_URI`` | (none) | ``s3://bucket/key``, ``file:///path`` or a path; without it ``NodeNames`` is refused |
| ``SNAPSHOT_REFRESH_S`` | 10 | re-check the snapshot's ETag at most this often |
| ``MAX_SNAPSHOT_AGE_S`` | 180 | refuse (filter ``Error``) a snapshot older than this |
| ``MAX_BODY_BYTES`` | 6291456 | largest request body (Lambda's own limit is 6 MB) |
| ``SCORE_WEIGHT_FIT`` | 0.7 | best-fit weight |
| ``SCORE_WEIGHT_UTILIZATION`` | 0.3 | low-utilisation weight |
| ``SCORE_WEIGHT_LOCALITY`` | 0.5 | network-locality weight (pods with ``gpu-scheduler.io/peers``) |
| ``LOCALITY_LABEL_KEYS`` | app,app.kubernetes.io/name | label keys peers may select on |
| ``LOCALITY_ZONE_ALPHA`` | 0.5 | value of a peer pod in the same zone, on another node |
| ``LOCALITY_ZONE_VALUES`` | (none) | JSON ``{zone: {zone: value}}`` replacing the same-zone/other-zone steps |
| ``LOCALITY_SELF_WEIGHT`` | 1.0 | weight of a pod's own workload among its peers (0: off) |
| ``SHARE_POLICY`` | fgd_cpu | places shares: ``fgd_cpu`` (FGD), ``gpu_packing``, ``bestfit`` or ``dotprod`` |
| ``LEDGER_TABLE`` | (none) | the GPU ledger's DynamoDB table; with it, ``/bind`` and ``/preempt`` are served |
| ``CLUSTER_NAME`` | (none) | with ``LEDGER_TABLE``: the EKS cluster bind writes to |
| ``KUBE_API_URL`` / ``KUBE_TOKEN``, ``KUBECONFIG`` | (none) | instead of ``CLUSTER_NAME`` (local runs) |
| ``POWERTOOLS_METRICS_NAMESPACE`` | GpuScheduler | CloudWatch namespace of the EMF metrics |
| ``POWERTOOLS_SERVICE_NAME`` | gpu-scheduler-extender | service name in logs, metrics, traces |
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from adapters.metric_catalogue import EXTENDER, NAMESPACE
from adapters.settings import CLUSTER_ACCESS_ENV, ClusterAccess, load_settings
from scheduler_core.extender.facade import ExtenderConfig
from scheduler_core.scoring.gpu_fit import ScoreWeights
from scheduler_core.scoring.locality import DEFAULT_LABEL_KEYS, LocalitySettings
from scheduler_core.scoring.share_fit import DEFAULT_SHARE_POLICY, SHARE_POLICIES

LAMBDA_MAX_BODY_BYTES = 6 * 2**20


_ENV = CLUSTER_ACCESS_ENV | {
    "snapshot_uri": "SNAPSHOT_URI",
    "snapshot_refresh_s": "SNAPSHOT_REFRESH_S",
    "max_snapshot_age_s": "MAX_SNAPSHOT_AGE_S",
    "max_body_bytes": "MAX_BODY_BYTES",
    "weight_fit": "SCORE_WEIGHT_FIT",
    "weight_utilization": "SCORE_WEIGHT_UTILIZATION",
    "weight_locality": "SCORE_WEIGHT_LOCALITY",
    "locality_label_keys": "LOCALITY_LABEL_KEYS",
    "locality_zone_alpha": "LOCALITY_ZONE_ALPHA",
    "locality_zone_values": "LOCALITY_ZONE_VALUES",
    "locality_self_weight": "LOCALITY_SELF_WEIGHT",
    "share_policy": "SHARE_POLICY",
    "ledger_table": "LEDGER_TABLE",
    "metrics_namespace": "POWERTOOLS_METRICS_NAMESPACE",
    "service": "POWERTOOLS_SERVICE_NAME",
}


@dataclass(frozen=True)
class ExtenderSettings(ClusterAccess):
    snapshot_uri: str = ""
    snapshot_refresh_s: float = 10.0
    max_snapshot_age_s: float = 180.0
    max_body_bytes: int = LAMBDA_MAX_BODY_BYTES
    weight_fit: float = 0.7
    weight_utilization: float = 0.3
    weight_locality: float = 0.5
    locality_label_keys: str = ",".join(DEFAULT_LABEL_KEYS)
    locality_zone_alpha: float = 0.5
    locality_zone_values: str = ""
    locality_self_weight: float = 1.0
    share_policy: str = DEFAULT_SHARE_POLICY
    ledger_table: str = ""
    metrics_namespace: str = NAMESPACE
    service: str = EXTENDER

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> ExtenderSettings:
        """Read the environment; an explicit keyword argument wins over it.

        Raises
        ------
        ConfigError
            Listing every invalid variable with its name and value, at start-up.

        >>> ExtenderSettings.from_env({"SNAPSHOT_URI": "s3://b/k"}, max_snapshot_age_s=60).max_snapshot_age_s
        60
        """
        return load_settings(cls, _ENV, environ, overrides)

    def problems(self) -> list[str]:
        """Every invalid setting, named by its environment variable."""
        found = []
        for name in ("snapshot_refresh_s", "max_snapshot_age_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value < 0:
                found.append(f"{_ENV[name]}: must be a non-negative number of seconds, got {value!r}")
        if "://" in self.snapshot_uri and not self.snapshot_uri.startswith(("s3://", "file://")):
            found.append(f"SNAPSHOT_URI: expected s3://bucket/key, file:///path or a path, got {self.snapshot_uri!r}")
        # The core names fields by path (weights.fit, locality.zone_alpha...): name the variables instead.
        renames = {f"weights.{name}": _ENV[f"weight_{name}"] for name in ("fit", "utilization", "locality")}
        renames |= {
            f"locality.{name}": _ENV[f"locality_{name}"]
            for name in ("label_keys", "zone_alpha", "zone_values", "self_weight")
        }
        try:
            problems = self._weights().problems() + self._locality().problems()
        except ValueError as exc:
            problems = [f"locality.zone_values: {exc}"]
        for problem in problems:
            for old, new in renames.items():
                problem = problem.replace(old, new)
            found.append(problem)
        if not isinstance(self.max_body_bytes, int) or self.max_body_bytes <= 0:
            found.append(f"MAX_BODY_BYTES: must be a positive integer, got {self.max_body_bytes!r}")
        if self.share_policy not in SHARE_POLICIES:
            found.append(f"SHARE_POLICY: expected one of {', '.join(SHARE_POLICIES)}, got {self.share_policy!r}")
        if self.ledger_table:
            found.extend(problem + " (bind needs the API)" for problem in self.access_problems())
        return found

    def _weights(self) -> ScoreWeights:
        return ScoreWeights(fit=self.weight_fit, utilization=self.weight_utilization, locality=self.weight_locality)

    def _locality(self) -> LocalitySettings:
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
        config = ExtenderConfig(
            weights=self._weights(),
            max_body_bytes=self.max_body_bytes,
            locality=self._locality(),
            share_policy=self.share_policy,
        )
        return config.validated()
