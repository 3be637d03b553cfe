"""Node-state refresher settings, read once from the environment (the table in ``docs/configuration.md``
is generated from the declarations below)."""

from __future__ import annotations

from dataclasses import dataclass

from adapters.amp import DEFAULT_GPU_LABEL, DEFAULT_NODE_LABEL, DEFAULT_UTILIZATION_QUERY, DEFAULT_WINDOW
from adapters.metric_catalogue import NAMESPACE, NODE_STATE
from adapters.settings import ClusterAccess, env_names, setting
from manifests.reservation import DEFAULT_IMAGE as RESERVATION_IMAGE
from manifests.reservation import image_problems
from scheduler_core.errors import Namer
from scheduler_core.k8s.node_labels import LABEL_POLICIES
from scheduler_core.state.demand import PlaceholderCaps


@dataclass(frozen=True)
class NodeStateSettings(ClusterAccess):
    """The node-state refresher's settings (:meth:`~adapters.settings.ClusterAccess.from_env`).

    >>> NodeStateSettings.from_env({"CLUSTER_NAME": "prod", "SNAPSHOT_URI": "s3://b/k"}).label_policy
    'fill'
    """

    snapshot_uri: str = setting(
        "SNAPSHOT_URI", "", "where the snapshot goes: `s3://bucket/key`, `file:///path` or a path (required)"
    )
    label_policy: str = setting(
        "LABEL_POLICY", "fill", "`fill` writes missing GPU labels; `enforce` also corrects differing ones"
    )
    label_dry_run: bool = setting(
        "LABEL_DRY_RUN", False, "plan and log label patches without sending them (the snapshot is still written)"
    )
    patch_concurrency: int = setting("PATCH_CONCURRENCY", 8, "label patches in flight at once (1..64)")
    amp_query_url: str = setting(
        "AMP_QUERY_URL", "", "AMP workspace URL (`https://aps-workspaces.R.amazonaws.com/workspaces/ws-…`)"
    )
    utilization_query: str = setting(
        "UTILIZATION_QUERY",
        DEFAULT_UTILIZATION_QUERY,
        "PromQL template with `{node_label}`, `{gpu_label}`, `{window}`",
        shown="DCGM average",
    )
    utilization_node_label: str = setting("UTILIZATION_NODE_LABEL", DEFAULT_NODE_LABEL, "series label naming the node")
    utilization_gpu_label: str = setting(
        "UTILIZATION_GPU_LABEL", DEFAULT_GPU_LABEL, "series label giving the GPU index"
    )
    utilization_window: str = setting("UTILIZATION_WINDOW", DEFAULT_WINDOW, "averaging window")
    deadline_margin_s: float = setting(
        "DEADLINE_MARGIN_S", 10.0, "stop starting work this long before the Lambda deadline"
    )
    watch_s: float = setting(
        "WATCH_S",
        0.0,
        "after its run, keep the snapshot fresh from a watch until this many seconds after the start "
        "(0: one run). Set it above the schedule's period so that the next run takes over with no gap",
    )
    publish_debounce_s: float = setting(
        "PUBLISH_DEBOUNCE_S", 1.0, "while watching, write the snapshot this long after the first change it lacks"
    )
    ledger_table: str = setting(
        "LEDGER_TABLE", "", "the GPU ledger (GPU sharing): reconcile it with the pods every run"
    )
    reservation_image: str = setting(
        "RESERVATION_IMAGE",
        RESERVATION_IMAGE,
        "with `LEDGER_TABLE`: the reservation pods' image; their pods are reconciled with the ledger, and a "
        "GPU's is removed when the watch sees its last share go. `none`: reservation pods are left alone",
        context="reservationImage",
    )
    placeholders_per_namespace: int = setting(
        "PLACEHOLDERS_PER_NAMESPACE",
        PlaceholderCaps.per_namespace,
        "with `LEDGER_TABLE`: the most placeholders that stand at once for the shares of one namespace "
        "(metric `PlaceholdersHeldBack` counts the whole GPUs the caps hold back)",
        context="placeholdersPerNamespace",
    )
    placeholders_total: int = setting(
        "PLACEHOLDERS_TOTAL",
        PlaceholderCaps.total,
        "with `LEDGER_TABLE`: the most placeholders that stand at once in all, shared out namespace by namespace",
        context="placeholdersTotal",
    )
    metrics_namespace: str = setting(
        "POWERTOOLS_METRICS_NAMESPACE", NAMESPACE, "CloudWatch namespace of the EMF metrics"
    )
    service: str = setting("POWERTOOLS_SERVICE_NAME", NODE_STATE, "service name in logs and metrics")

    @property
    def placeholder_caps(self) -> PlaceholderCaps:
        return PlaceholderCaps(self.placeholders_per_namespace, self.placeholders_total)

    def problems(self, name: Namer | None = None) -> list[str]:
        """Every invalid setting, each named by ``name`` of its field (its variable by default)."""
        name = name or env_names(type(self))
        found = self.access_problems(name)
        if not self.snapshot_uri:
            found.append(f"{name('snapshot_uri')}: required (s3://bucket/key, file:///path or a path)")
        if self.label_policy not in LABEL_POLICIES:
            policy = self.label_policy
            found.append(f"{name('label_policy')}: expected one of {', '.join(LABEL_POLICIES)}, got {policy!r}")
        if self.patch_concurrency < 1 or self.patch_concurrency > 64:
            found.append(f"{name('patch_concurrency')}: expected 1..64, got {self.patch_concurrency}")
        if self.ledger_table:
            found += image_problems(name("reservation_image"), self.reservation_image)
        found += self.placeholder_problems(name)
        if self.watch_s < 0:
            found.append(f"{name('watch_s')}: must be non-negative, got {self.watch_s}")
        if not 0.05 <= self.publish_debounce_s <= 30:
            found.append(f"{name('publish_debounce_s')}: expected 0.05..30 seconds, got {self.publish_debounce_s}")
        if self.deadline_margin_s < 0:
            found.append(f"{name('deadline_margin_s')}: must be non-negative, got {self.deadline_margin_s}")
        try:
            self.utilization_query.format(node_label="n", gpu_label="g", window="5m")
        except (KeyError, IndexError, ValueError) as exc:
            where = name("utilization_query")
            found.append(f"{where}: placeholders are {{node_label}}, {{gpu_label}}, {{window}}: {exc!r}")
        return found

    def placeholder_problems(self, name: Namer | None = None) -> list[str]:
        """The placeholder caps' checks alone (the CDK app passes them on), named by ``name`` of each field."""
        name = name or env_names(type(self))
        return self.placeholder_caps.problems(lambda path: name(path.replace(".", "_")))
