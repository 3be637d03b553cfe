"""Node-state refresher settings, read once from the environment.

| variable | default | meaning |
|---|---|---|
| ``CLUSTER_NAME`` | (none) | EKS cluster: endpoint and CA from ``DescribeCluster``, IAM token from STS |
| ``KUBE_API_URL`` / ``KUBE_TOKEN`` | (none) | instead of ``CLUSTER_NAME``: an API URL and a bearer token |
| ``KUBECONFIG`` | (none) | instead of both: a kubeconfig file (local runs) |
| ``SNAPSHOT_URI`` | (none, required) | where the snapshot goes: ``s3://bucket/key``, ``file:///path`` or a path |
| ``LABEL_POLICY`` | fill | ``fill`` writes missing GPU labels; ``enforce`` also corrects differing ones |
| ``LABEL_DRY_RUN`` | false | plan and log label patches without sending them (the snapshot is still written) |
| ``PATCH_CONCURRENCY`` | 8 | label patches in flight at once |
| ``AMP_QUERY_URL`` | (none) | AMP workspace URL (``https://aps-workspaces.R.amazonaws.com/workspaces/ws-…``) |
| ``UTILIZATION_QUERY`` | DCGM average | PromQL template with ``{node_label}``, ``{gpu_label}``, ``{window}`` |
| ``UTILIZATION_NODE_LABEL`` | Hostname | series label naming the node |
| ``UTILIZATION_GPU_LABEL`` | gpu | series label giving the GPU index |
| ``UTILIZATION_WINDOW`` | 5m | averaging window |
| ``LEDGER_TABLE`` | (none) | the GPU ledger (GPU sharing): reconcile it with the pods every run |
| ``DEADLINE_MARGIN_S`` | 10 | stop starting work this long before the Lambda deadline |
| ``POWERTOOLS_METRICS_NAMESPACE`` | GpuScheduler | CloudWatch namespace of the EMF metrics |
| ``POWERTOOLS_SERVICE_NAME`` | gpu-scheduler-node-state | service name in logs and metrics |
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from adapters.amp import DEFAULT_GPU_LABEL, DEFAULT_NODE_LABEL, DEFAULT_UTILIZATION_QUERY, DEFAULT_WINDOW
from adapters.settings import CLUSTER_ACCESS_ENV, ClusterAccess, load_settings
from scheduler_core.k8s.node_labels import LABEL_POLICIES

_ENV = CLUSTER_ACCESS_ENV | {
    "snapshot_uri": "SNAPSHOT_URI",
    "label_policy": "LABEL_POLICY",
    "label_dry_run": "LABEL_DRY_RUN",
    "patch_concurrency": "PATCH_CONCURRENCY",
    "amp_query_url": "AMP_QUERY_URL",
    "utilization_query": "UTILIZATION_QUERY",
    "utilization_node_label": "UTILIZATION_NODE_LABEL",
    "utilization_gpu_label": "UTILIZATION_GPU_LABEL",
    "utilization_window": "UTILIZATION_WINDOW",
    "deadline_margin_s": "DEADLINE_MARGIN_S",
    "ledger_table": "LEDGER_TABLE",
}


@dataclass(frozen=True)
class NodeStateSettings(ClusterAccess):
    snapshot_uri: str = ""
    label_policy: str = "fill"
    label_dry_run: bool = False
    patch_concurrency: int = 8
    amp_query_url: str = ""
    utilization_query: str = DEFAULT_UTILIZATION_QUERY
    utilization_node_label: str = DEFAULT_NODE_LABEL
    utilization_gpu_label: str = DEFAULT_GPU_LABEL
    utilization_window: str = DEFAULT_WINDOW
    deadline_margin_s: float = 10.0
    ledger_table: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> NodeStateSettings:
        """Read the environment; explicit keyword arguments win.

        Raises
        ------
        ConfigError
            Naming every invalid variable and its value.

        >>> NodeStateSettings.from_env({"CLUSTER_NAME": "prod", "SNAPSHOT_URI": "s3://b/k"}).label_policy
        'fill'
        """
        return load_settings(cls, _ENV, environ, overrides)

    def problems(self) -> list[str]:
        found = self.access_problems()
        if not self.snapshot_uri:
            found.append("SNAPSHOT_URI: required (s3://bucket/key, file:///path or a path)")
        if self.label_policy not in LABEL_POLICIES:
            found.append(f"LABEL_POLICY: expected one of {', '.join(LABEL_POLICIES)}, got {self.label_policy!r}")
        if self.patch_concurrency < 1 or self.patch_concurrency > 64:
            found.append(f"PATCH_CONCURRENCY: expected 1..64, got {self.patch_concurrency}")
        if self.deadline_margin_s < 0:
            found.append(f"DEADLINE_MARGIN_S: must be non-negative, got {self.deadline_margin_s}")
        try:
            self.utilization_query.format(node_label="n", gpu_label="g", window="5m")
        except (KeyError, IndexError, ValueError) as exc:
            found.append(f"UTILIZATION_QUERY: placeholders are {{node_label}}, {{gpu_label}}, {{window}}: {exc!r}")
        return found
