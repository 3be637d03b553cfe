"""The extender service: one composition root and one set of rules for both transports.

:func:`build` makes, from :class:`~application.extender.settings.ExtenderSettings`, the cluster source (the
snapshot at ``SNAPSHOT_URI``, a cluster file, or a live watch of the cluster), this instance's ledger
readings, the GPU ledger behind bind and preempt, and the :class:`ExtenderService` around them. The Lambda
handler (API Gateway events) and ``gpu-scheduler serve`` (HTTP) only translate a request into one of its
methods and its :class:`Answer` back; what they share lives here:

- the body limit: one rule, :meth:`~scheduler_core.extender.facade.Extender.refuse_size` (``serve``
  applies it to ``Content-Length`` through :meth:`ExtenderService.refuse_length`, before reading a body);
- reply trimming: a filter reply over ``max_reply_bytes`` is cut by
  :meth:`~scheduler_core.extender.decide.FilterOutcome.to_json_within`. The Lambda sets it (a Lambda
  response is capped at 6 MB); ``serve`` does not, since HTTP itself has no such cap;
- what each answer records (:class:`adapters.telemetry.Telemetry`: EMF on Lambda, Prometheus text on
  ``serve``) and logs, from the catalogue in :mod:`adapters.metric_catalogue`;
- the 404 and 500 answers, and ``GET /healthz``.

It imports nothing the filter and prioritize path does not need: boto3 and botocore come with the
snapshot store's S3 client and the ledger (``LEDGER_TABLE``), the ``kubernetes`` client with the first
bind, and the cluster file and the live watch only when asked for.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters.ledger_readings import LedgerReadings
from adapters.settings import env_names
from adapters.snapshot_store import RefreshEvent, SnapshotSource, open_store
from adapters.telemetry import PrometheusTelemetry, Telemetry
from application.extender.settings import ExtenderSettings
from scheduler_core.errors import ClusterStateUnavailableError, ConfigError, Namer
from scheduler_core.extender import (
    SHARING_VERBS,
    VERBS,
    Accounting,
    BindOutcome,
    ClusterSource,
    Extender,
    ExtenderConfig,
    Reply,
)
from scheduler_core.extender.decide import FilterOutcome, PrioritizeOutcome
from scheduler_core.extender.preemption import PreemptOutcome
from scheduler_core.extender.wire import STATUS, encode_json, error_body
from scheduler_core.state.readings import DEFAULT_MARGIN_S

if TYPE_CHECKING:
    from adapters.holds_source import HoldsSource
    from adapters.live_state import LiveState

ROUTED_VERBS = frozenset(VERBS + SHARING_VERBS)
"""The paths a transport hands to :meth:`ExtenderService.answer`; anything else is
:meth:`ExtenderService.not_found`. A verb this extender does not serve (bind without a ledger) is the
facade's own 404."""
SYNC_TIMEOUT_S = 60.0
"""How long a live watch waits for its first lists of nodes and pods before the extender serves."""
LIVE_MARGIN_S = 10.0
"""How long a reading outlives a live state generated after it, for a pod whose bind the watch never
shows (the watch forgets the others as soon as it shows them)."""
LATENCY_METRIC = {
    "filter": "FilterLatencyMs",
    "prioritize": "PrioritizeLatencyMs",
    "bind": "BindLatencyMs",
    "preempt": "PreemptLatencyMs",
}
INTERNAL_ERROR = "internal error in the extender; see its log"
WARM_NAMES = 1000
"""The nodes the warm-up request before SnapStart's snapshot names (kube-scheduler's requests name the
feasible nodes, up to every node of the cluster)."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Answer:
    """What a transport sends back: an HTTP status and a JSON body."""

    status: int
    body: bytes


class ExtenderService:
    """The extender with what both transports share around it.

    Parameters
    ----------
    extender : Extender
    source : ClusterSource, optional
        The cluster source the extender decides from (for ``/healthz`` and ``SnapshotAgeSeconds``).
    telemetry : Telemetry, optional
        Where the metrics go; an in-process Prometheus registry by default.
    logger : logging.Logger or Powertools Logger, optional
        Where the decisions are logged (``extra`` holds the structured fields).
    max_reply_bytes : int, optional
        Cut a filter reply over this many bytes (the Lambda's cap); None: never.
    live : LiveState, optional
        The live watch behind ``source``, started by :meth:`start` and stopped by :meth:`close`.
    decision_level : int
        The level of the one line logged per decision (``logging.INFO`` on Lambda, where it is the
        record; ``serve`` logs them at DEBUG, off its hot path unless ``-v``). Its fields are computed
        only when it is written.
    """

    def __init__(
        self,
        extender: Extender,
        source: ClusterSource | None = None,
        *,
        telemetry: Telemetry | None = None,
        logger: Any = None,
        max_reply_bytes: int | None = None,
        live: Any = None,
        decision_level: int = logging.INFO,
    ) -> None:
        self.extender = extender
        self.source = source
        self.telemetry: Telemetry = telemetry if telemetry is not None else PrometheusTelemetry()
        self.log = logger if logger is not None else log
        self.max_reply_bytes = max_reply_bytes
        self.live = live
        self.decision_level = decision_level

    # -- the requests ---------------------------------------------------------------------------
    def answer(self, verb: str, body: bytes, *, path: str = "") -> Answer:
        """Answer one extender call (``verb`` one of :data:`ROUTED_VERBS`), record it, and cut a filter
        reply over ``max_reply_bytes``. A fault below is logged and answered 500, never raised."""
        started = time.perf_counter()
        try:
            reply = self.extender.respond(verb, body)
            self._record(verb, reply, 1000 * (time.perf_counter() - started))
            payload = reply.body
            limit = self.max_reply_bytes
            if limit is not None and len(payload) > limit and isinstance(reply.outcome, FilterOutcome):
                payload = reply.outcome.to_json_within(limit)
                self.telemetry.record("RepliesCut", 1, verb)
        except Exception:
            return self.internal_error(path or f"/{verb}")
        return Answer(reply.status, payload)

    def refuse_length(self, verb: str, length: int) -> Answer | None:
        """The body limit applied to a declared length (``Content-Length``) before the body is read:
        the 400 :meth:`answer` would give for that body, recorded the same way, or None."""
        if verb not in self.extender.verbs:  # the facade's 404 comes first, whatever the body's size
            return self.answer(verb, b"")
        started = time.perf_counter()
        reply = self.extender.refuse_size(length)
        if reply is None:
            return None
        self._record(verb, reply, 1000 * (time.perf_counter() - started))
        return Answer(reply.status, reply.body)

    def bad_request(self, verb: str, message: str) -> Answer:
        """A 400 for a request the transport cannot hand over (no ``Content-Length``, bad base64)."""
        self.telemetry.record("BadRequests", 1)
        self.log.warning("bad request", extra={"verb": verb, "status": 400, "kind": "transport", "error": message})
        return Answer(STATUS["transport"], error_body(message))

    def not_found(self, method: str, path: str) -> Answer:
        """A 404 for a path that is no route, naming the routes."""
        self.telemetry.record("BadRequests", 1)
        message = f"no route {method} {path[:64]!r}: {', '.join(self.routes)}"
        self.log.warning("no route", extra={"method": method[:16], "path": path[:64]})
        return Answer(STATUS["no_route"], error_body(message))

    def internal_error(self, path: str) -> Answer:
        """A 500 for a fault: logged with its traceback (call it from an ``except`` block), never shown."""
        self.log.exception("internal error", extra={"path": path[:64]})
        self.telemetry.record("InternalErrors", 1)
        return Answer(STATUS["internal"], error_body(INTERNAL_ERROR))

    def health(self) -> Answer:
        """``GET /healthz``: whether each part is configured, never its name (the bucket, the table and
        the cluster are not the caller's business); ``snapshot`` is whether there is a cluster source. A
        source that has no usable state now (a snapshot missing, stale or corrupt, a watch still listing)
        makes it a 503 with the failure's kind: filter would answer every pod ``Error`` meanwhile."""
        ledger = self.extender.accounting is not None
        body: dict[str, Any] = {
            "status": "ok",
            "snapshot": self.source is not None,
            "ledger": ledger,
            "verbs": list(self.extender.verbs),
        }
        if self.source is not None:
            try:
                self.source()
            except ClusterStateUnavailableError as exc:
                return Answer(STATUS["unavailable"], encode_json({**body, "status": "unavailable", "reason": exc.kind}))
        return Answer(STATUS[""], encode_json(body))

    @property
    def routes(self) -> list[str]:
        return [*(f"POST /{verb}" for verb in self.extender.verbs), "GET /healthz"]

    # -- the process ----------------------------------------------------------------------------
    def start(self, sync_timeout_s: float = SYNC_TIMEOUT_S) -> bool:
        """Start the live watch, if there is one, and wait for its first lists; whether they are in.

        Like an informer's cache sync: kube-scheduler parks a pod that got an error until the next
        cluster event, so serving before the first lists are in would strand the first pods for minutes."""
        if self.live is None:
            return True
        synced = bool(self.live.start().wait_synced(sync_timeout_s))
        if not synced:
            self.log.warning(
                "the live state is not listed after %.0f s; serving, and answering Error until it is", sync_timeout_s
            )
        return synced

    def close(self) -> None:
        if self.live is not None:
            self.live.close()

    # -- SnapStart ------------------------------------------------------------------------------
    def before_snapshot(self) -> bool:
        """What Lambda runs once, when it publishes a version, before it snapshots the initialised
        function: the cluster snapshot read, and one filter and one prioritize decided on it (a one-GPU
        pod over up to :data:`WARM_NAMES` of its nodes) by a throwaway extender of the same
        configuration, which records nothing, so that the code, caches and allocations the first request
        needs are in the snapshot. Whether a decision ran (there was a snapshot to decide on)."""
        try:
            state = self.source() if self.source is not None else None
        except ClusterStateUnavailableError as exc:
            self.log.info("no cluster snapshot to warm the decision path on before SnapStart's snapshot: %s", exc)
            return False
        if state is None or state.table.n_nodes == 0:
            return False
        pod = {
            "metadata": {"name": "snapstart-warm-up", "namespace": "default", "uid": "snapstart-warm-up"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        }
        body = encode_json({"Pod": pod, "Nodes": None, "NodeNames": list(state.table.names[:WARM_NAMES])})
        probe = Extender(self.extender.config, lambda: state)
        return all(probe.respond(verb, body).status == 200 for verb in ("filter", "prioritize"))

    def after_restore(self) -> None:
        """What Lambda runs in each environment it restores from the snapshot, before its first request:
        new clients for the snapshot store and the GPU ledger (and a new Kubernetes client on the next
        bind), since connections and credentials made before the snapshot do not carry over; the cluster
        snapshot read again (a conditional read: kept if unchanged), here rather than in the first
        request's time; and Python's ``random`` reseeded, which every restored environment would
        otherwise share."""
        random.seed()
        if isinstance(self.source, SnapshotSource):
            reconnect = getattr(self.source.store, "reconnect", None)
            if reconnect is not None:
                reconnect()
            self.source.expire()
            try:  # read again now (Lambda gives this hook 10 s), not in the first request's time
                self.source()
            except ClusterStateUnavailableError as exc:  # the first request answers it, as any request would
                self.log.warning("after SnapStart's restore, the cluster snapshot is unavailable: %s", exc)
        reconnect = getattr(self.extender.accounting, "reconnect", None)
        if reconnect is not None:
            reconnect()

    def metrics_text(self) -> str:
        """Prometheus text: the recorded metrics (with :class:`PrometheusTelemetry`), then the live
        watch's (``gpu_scheduler_live_state_*``)."""
        text = self.telemetry.text() if isinstance(self.telemetry, PrometheusTelemetry) else ""
        if self.live is not None:
            from adapters.live_state import prometheus_text

            text += prometheus_text(self.live.stats())
        return text

    # -- what an answer records -----------------------------------------------------------------
    def _record(self, verb: str, reply: Reply, elapsed_ms: float) -> None:
        outcome = reply.outcome
        pod: dict[str, str] = {}
        if isinstance(outcome, FilterOutcome | PrioritizeOutcome) and outcome.demand is not None:
            demand = outcome.demand
            pod = {"pod_namespace": demand.namespace, "pod_name": demand.name, "pod_uid": demand.uid}
        telemetry = self.telemetry
        telemetry.record(LATENCY_METRIC[verb], round(elapsed_ms, 3))
        age_s = getattr(self.source, "last_age_s", None)
        if age_s is not None:
            telemetry.record("SnapshotAgeSeconds", round(age_s, 1))
        ms = round(elapsed_ms, 3)
        if 400 <= reply.status < 500:
            telemetry.record("BadRequests", 1)
            error = reply.body[:500].decode(errors="replace")
            self.log.warning(
                "bad request", extra={"verb": verb, "status": reply.status, "kind": reply.error_kind, "error": error}
            )
            return
        if isinstance(outcome, FilterOutcome):
            telemetry.record("NodesIn", outcome.nodes_in)
            telemetry.record("NodesFeasible", outcome.nodes_feasible)
            if outcome.nodes_feasible == 0:
                reasons = outcome.reason_counts()
                main = max(reasons, key=reasons.__getitem__) if reasons else "no_nodes"
                telemetry.record("Unschedulable", 1, outcome.error_kind or main)
            self._log_decision("filter", lambda: {"decision": outcome.summary(), "ms": ms, **pod})
        elif isinstance(outcome, PrioritizeOutcome):
            self._log_decision("prioritize", lambda: {"decision": outcome.summary(), "ms": ms, **pod})
        elif isinstance(outcome, BindOutcome):
            self._record_bind(outcome, ms)
        elif isinstance(outcome, PreemptOutcome):
            telemetry.record("PreemptNodesDropped", len(outcome.dropped))
            self._log_decision("preempt", lambda: {"decision": outcome.summary(), "ms": ms})
        else:
            self.log.warning(verb, extra={"status": reply.status, "kind": reply.error_kind})

    def _record_bind(self, outcome: BindOutcome, ms: float) -> None:
        telemetry = self.telemetry
        if outcome.conflicts:
            telemetry.record("LedgerConflicts", outcome.conflicts)
        if outcome.rolled_back:
            telemetry.record("BindRollbacks", 1)
        if outcome.error:
            telemetry.record("BindFailures", 1, outcome.error_kind)
            self.log.warning("bind failed", extra={"bind": outcome.summary(), "ms": ms})
            return
        telemetry.record("Binds", 1)
        self._log_decision("bind", lambda: {"bind": outcome.summary(), "ms": ms})

    def _log_decision(self, message: str, fields: Callable[[], dict[str, Any]]) -> None:
        if self.log.isEnabledFor(self.decision_level):
            # The level's own method: Powertools' Logger takes ``extra`` there (its ``log`` is the stdlib's).
            getattr(self.log, logging.getLevelName(self.decision_level).lower())(message, extra=fields())


def report_refresh(telemetry: Telemetry, logger: Any, event: RefreshEvent) -> None:
    """Hears each snapshot refresh: a failure is logged and counted by its kind."""
    if event.result in ("loaded", "unchanged"):
        logger.debug("snapshot refresh", extra={"result": event.result, "ms": round(event.duration_ms, 2)})
        return
    logger.warning("snapshot refresh failed", extra={"result": event.result, "detail": event.detail})
    telemetry.record("SnapshotRefreshFailures", 1, event.result)


def build(
    settings: ExtenderSettings,
    *,
    cluster_file: str | Path | None = None,
    watch: bool = False,
    telemetry: Telemetry | None = None,
    logger: Any = None,
    max_reply_bytes: int | None = None,
    decision_level: int = logging.INFO,
    trace: Callable[[str], AbstractContextManager[Any]] | None = None,
    session: Any = None,
    named_by: Namer | None = None,
) -> ExtenderService:
    """The extender service for ``settings``.

    The cluster source is, in this order: a live watch of the cluster ``settings`` reach (``watch``), the
    JSON file ``cluster_file`` (re-read every ``snapshot_refresh_s``), the snapshot at ``snapshot_uri``,
    or none. ``telemetry``, ``logger``, ``max_reply_bytes`` and ``decision_level`` are the
    :class:`ExtenderService`'s. ``trace`` wraps each snapshot refresh in a tracing subsegment;
    ``session`` is the boto3 session of the ledger's client (boto3's default when None). ``named_by`` names
    the settings in a :class:`ConfigError` (their variables by default; ``serve`` names its flags). Nothing is
    started: see :meth:`ExtenderService.start`.

    Raises
    ------
    ConfigError
        ``watch`` without a cluster to watch, or a ``snapshot_uri`` no store can open.
    InvalidArgsError
        A ``cluster_file`` that cannot be read or parsed.
    """
    config = settings.extender_config()
    telemetry = telemetry if telemetry is not None else PrometheusTelemetry()
    logger = logger if logger is not None else log
    # With a live state, readings older than the state are dropped sooner: it catches up in milliseconds.
    readings = LedgerReadings(margin_s=LIVE_MARGIN_S if watch else DEFAULT_MARGIN_S)
    name = named_by or env_names(ExtenderSettings)
    live = _live_state(settings, config, readings, name) if watch else None
    source: ClusterSource | None = live
    if live is None and cluster_file is not None:
        from adapters.cluster_file import ClusterFile

        source = ClusterFile(cluster_file, refresh_s=settings.snapshot_refresh_s)
    elif live is None and settings.snapshot_uri:
        source = _snapshot_source(settings, partial(report_refresh, telemetry, logger), trace, name)
    accounting = _ledger_binder(settings, source, readings, live, session, logger) if settings.ledger_table else None
    holds = _holds_source(settings, name) if settings.holds_uri else None
    extender = Extender(config, source, readings, accounting, holds)
    return ExtenderService(
        extender,
        source,
        telemetry=telemetry,
        logger=logger,
        max_reply_bytes=max_reply_bytes,
        live=live,
        decision_level=decision_level,
    )


def _live_state(settings: ExtenderSettings, config: ExtenderConfig, readings: LedgerReadings, name: Namer) -> LiveState:
    """The live watch of the cluster ``settings`` reach (:class:`~adapters.live_state.LiveState`)."""
    from adapters.live_state import LiveState

    if settings.access_problems():
        where = f"{name('cluster_name')}, {name('kube_api_url')} or {name('kubeconfig')}"
        raise ConfigError(f"a live watch needs {where}: the cluster to watch")
    return LiveState(lambda: settings.connect(None), label_keys=config.locality.label_keys, readings=readings)


def _holds_source(settings: ExtenderSettings, name: Namer) -> HoldsSource:
    """The consolidator's holds at ``settings.holds_uri``, re-checked as often as the snapshot."""
    from adapters.holds_source import HoldsSource

    try:
        store = open_store(settings.holds_uri)
    except ValueError as exc:
        raise ConfigError(f"{name('holds_uri')}: {exc}") from exc
    return HoldsSource(store, refresh_s=settings.snapshot_refresh_s)


def _snapshot_source(
    settings: ExtenderSettings,
    on_refresh: Callable[[RefreshEvent], None],
    trace: Callable[[str], AbstractContextManager[Any]] | None,
    name: Namer,
) -> SnapshotSource:
    """The snapshot at ``settings.snapshot_uri``, re-checked every ``snapshot_refresh_s``."""
    try:
        store = open_store(settings.snapshot_uri)
    except ValueError as exc:
        raise ConfigError(f"{name('snapshot_uri')}: {exc}") from exc
    return SnapshotSource(
        store,
        refresh_s=settings.snapshot_refresh_s,
        max_age_s=settings.max_snapshot_age_s,
        trace=trace,
        on_refresh=on_refresh,
    )


def _ledger_binder(
    settings: ExtenderSettings,
    source: ClusterSource | None,
    readings: LedgerReadings,
    live: LiveState | None,
    session: Any,
    logger: Any,
) -> Accounting:
    """The binder on the ledger table ``settings`` name; with a live state, each learns of the other's pods
    (a pod gone frees its share, and a bind asks where a pod already is)."""
    from shares.binder import ledger_binder

    binder = ledger_binder(
        settings.ledger_table,
        settings,
        session=session,
        cluster=source,
        readings=readings,
        reservation_image=settings.reservation_image,
        share_device=settings.share_device,
    )
    if settings.env_device_warning:
        logger.warning(settings.env_device_warning)
    if live is not None:
        live.on_gone, binder.gone, binder.node_of = binder.release_pod, live.gone_on, live.node
    return binder
