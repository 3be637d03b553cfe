"""kube-scheduler extender on Lambda: API Gateway REST proxy events (payload v1) in, extender replies out.

Routes: ``POST /filter``, ``POST /prioritize``, ``GET /healthz``, and with ``LEDGER_TABLE`` set
``POST /bind`` and ``POST /preempt`` (GPU sharing). The decision is the shared
:meth:`scheduler_core.extender.Extender.respond`, wired by ``lambdas/extender/service.py``; this
module only adapts the event, logs the decision and emits metrics.

Metrics: ``adapters.metric_catalogue`` lists them (EMF, namespace ``POWERTOOLS_METRICS_NAMESPACE``,
dimension ``service``).
"""

from __future__ import annotations

import base64
import binascii
import time
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from adapters.metric_catalogue import emit_count
from adapters.runtime import tune_allocator
from adapters.snapshot_store import RefreshEvent
from adapters.tracing import make_tracer
from lambdas.extender.config import ExtenderSettings
from lambdas.extender.service import build
from scheduler_core.extender.decide import FilterOutcome, PrioritizeOutcome
from scheduler_core.extender.facade import BindOutcome, Reply
from scheduler_core.extender.preemption import PreemptOutcome
from scheduler_core.extender.wire import encode_json

MAX_REPLY_BYTES = 5 * 2**20
"""The largest reply body sent: Lambda refuses a response over 6 MB, the proxy's JSON envelope
included (which escapes every quote in the body)."""

SETTINGS = ExtenderSettings.from_env()
logger = Logger(service=SETTINGS.service)
metrics = Metrics(namespace=SETTINGS.metrics_namespace, service=SETTINGS.service)
tracer = make_tracer(SETTINGS.service)
tune_allocator()


def _count(name: str, reason: str) -> None:
    """A count with its own ``reason`` dimension (kept out of the per-invocation metric set)."""
    emit_count(name, 1, namespace=SETTINGS.metrics_namespace, service=SETTINGS.service, reason=reason)


def _on_refresh(event: RefreshEvent) -> None:
    if event.result in ("loaded", "unchanged"):
        logger.debug("snapshot refresh", extra={"result": event.result, "ms": round(event.duration_ms, 2)})
        return
    logger.warning("snapshot refresh failed", extra={"result": event.result, "detail": event.detail})
    _count("SnapshotRefreshFailures", event.result)


SERVICE = build(SETTINGS, trace=lambda name: tracer.provider.in_subsegment(name=name), on_refresh=_on_refresh)
SOURCE, EXTENDER = SERVICE.source, SERVICE.extender
app = APIGatewayRestResolver()


@app.post("/filter")
def filter_route() -> Response[str]:
    return _answer("filter")


@app.post("/prioritize")
def prioritize_route() -> Response[str]:
    return _answer("prioritize")


@app.post("/bind")
def bind_route() -> Response[str]:
    return _answer("bind")


@app.post("/preempt")
def preempt_route() -> Response[str]:
    return _answer("preempt")


@app.get("/healthz")
def healthz() -> dict[str, Any]:
    # Whether each part is configured, never its name: the bucket and the table are not the caller's business.
    configured = {"snapshot": SOURCE is not None, "ledger": bool(SETTINGS.ledger_table)}
    return {"status": "ok", **configured, "verbs": list(EXTENDER.verbs)}


@app.not_found
def not_found(_exc: Exception) -> Response[str]:
    event = app.current_event
    routes = ", ".join(f"POST /{verb}" for verb in EXTENDER.verbs)
    message = f"no route {event.http_method} {event.path[:64]!r}: {routes}, GET /healthz"
    return Response(404, "application/json", encode_json({"Error": message}).decode())


@app.exception_handler(Exception)  # type: ignore[untyped-decorator]  # Powertools leaves it untyped
def internal_error(exc: Exception) -> Response[str]:
    logger.exception("internal error", extra={"path": app.current_event.path})
    metrics.add_metric(name="InternalErrors", unit=MetricUnit.Count, value=1)
    return Response(
        500, "application/json", encode_json({"Error": "internal error in the extender; see its log"}).decode()
    )


def _request_bytes() -> bytes | None:
    """The raw body, or None if it is marked base64 but is not. Not Powertools' ``decoded_body``,
    which raises on bytes that are not UTF-8: those must reach the JSON decoder and get a 400."""
    event = app.current_event
    body = event.body or ""
    if not event.is_base64_encoded:
        return body.encode()
    try:
        return base64.b64decode(body, validate=True)
    except binascii.Error:
        return None


def _answer(verb: str) -> Response[str]:
    body = _request_bytes()
    if body is None:
        metrics.add_metric(name="BadRequests", unit=MetricUnit.Count, value=1)
        message = "request body is marked base64-encoded but is not valid base64"
        return Response(400, "application/json", encode_json({"Error": message}).decode())
    started = time.perf_counter()
    with tracer.provider.in_subsegment(name=f"## {verb}"):
        reply = EXTENDER.respond(verb, body)
    elapsed_ms = 1000 * (time.perf_counter() - started)
    _record(verb, reply, elapsed_ms)
    payload = reply.body
    if len(payload) > MAX_REPLY_BYTES and isinstance(reply.outcome, FilterOutcome):
        payload = reply.outcome.to_json_within(MAX_REPLY_BYTES)
        _count("RepliesCut", verb)
    return Response(reply.status, "application/json", payload.decode())


_LATENCY = {
    "filter": "FilterLatencyMs",
    "prioritize": "PrioritizeLatencyMs",
    "bind": "BindLatencyMs",
    "preempt": "PreemptLatencyMs",
}


def _record(verb: str, reply: Reply, elapsed_ms: float) -> None:
    outcome = reply.outcome
    if isinstance(outcome, FilterOutcome | PrioritizeOutcome) and outcome.demand is not None:
        demand = outcome.demand
        logger.append_keys(pod_namespace=demand.namespace, pod_name=demand.name, pod_uid=demand.uid)
    metrics.add_metric(name=_LATENCY[verb], unit=MetricUnit.Milliseconds, value=round(elapsed_ms, 3))
    if SOURCE is not None and SOURCE.last_age_s is not None:
        metrics.add_metric(name="SnapshotAgeSeconds", unit=MetricUnit.Seconds, value=round(SOURCE.last_age_s, 1))
    if 400 <= reply.status < 500:
        metrics.add_metric(name="BadRequests", unit=MetricUnit.Count, value=1)
        logger.warning(
            "bad request",
            extra={
                "verb": verb,
                "status": reply.status,
                "kind": reply.error_kind,
                "error": reply.body[:500].decode(errors="replace"),
            },
        )
        return
    if isinstance(outcome, FilterOutcome):
        metrics.add_metric(name="NodesIn", unit=MetricUnit.Count, value=outcome.nodes_in)
        metrics.add_metric(name="NodesFeasible", unit=MetricUnit.Count, value=outcome.nodes_feasible)
        summary = outcome.summary()
        if outcome.nodes_feasible == 0:
            reasons = outcome.reason_counts()
            _count(
                "Unschedulable",
                outcome.error_kind or (max(reasons, key=reasons.__getitem__) if reasons else "no_nodes"),
            )
        logger.info("filter", extra={"decision": summary, "ms": round(elapsed_ms, 3)})
    elif isinstance(outcome, PrioritizeOutcome):
        logger.info("prioritize", extra={"decision": outcome.summary(), "ms": round(elapsed_ms, 3)})
    elif isinstance(outcome, BindOutcome):
        _record_bind(outcome, elapsed_ms)
    elif isinstance(outcome, PreemptOutcome):
        summary = outcome.summary()
        metrics.add_metric(name="PreemptNodesDropped", unit=MetricUnit.Count, value=len(outcome.dropped))
        logger.info("preempt", extra={"decision": summary, "ms": round(elapsed_ms, 3)})
    else:
        logger.warning(verb, extra={"status": reply.status, "kind": reply.error_kind})


def _record_bind(outcome: BindOutcome, elapsed_ms: float) -> None:
    if outcome.conflicts:
        metrics.add_metric(name="LedgerConflicts", unit=MetricUnit.Count, value=outcome.conflicts)
    if outcome.rolled_back:
        metrics.add_metric(name="BindRollbacks", unit=MetricUnit.Count, value=1)
    if outcome.error:
        _count("BindFailures", outcome.error_kind)
        logger.warning("bind failed", extra={"bind": outcome.summary(), "ms": round(elapsed_ms, 3)})
        return
    metrics.add_metric(name="Binds", unit=MetricUnit.Count, value=1)
    logger.info("bind", extra={"bind": outcome.summary(), "ms": round(elapsed_ms, 3)})


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return app.resolve(event, context)
