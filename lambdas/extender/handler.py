"""kube-scheduler extender on Lambda: API Gateway REST proxy events (payload v1) in, extender replies out.

Routes: ``POST /filter``, ``POST /prioritize``, ``GET /healthz``, and with ``LEDGER_TABLE`` set
``POST /bind`` and ``POST /preempt`` (GPU sharing). The extender service
(``application/extender/service.py``, shared with ``gpu-scheduler serve``) decides, logs and records each
call; this module only turns the event into a call of it and its answer into a proxy response.

Metrics: ``adapters.metric_catalogue`` lists them (EMF through :class:`adapters.telemetry.EmfTelemetry`,
namespace ``POWERTOOLS_METRICS_NAMESPACE``, dimension ``service``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.utilities.typing import LambdaContext

from adapters.runtime import tune_allocator
from adapters.telemetry import EmfTelemetry
from adapters.tracing import make_tracer
from application.extender.service import Answer, build
from application.extender.settings import ExtenderSettings

_HEALTHZ_EVENT = {
    "resource": "/healthz", "path": "/healthz", "httpMethod": "GET", "headers": {}, "multiValueHeaders": {},
    "queryStringParameters": None, "pathParameters": None, "body": None, "isBase64Encoded": False,
    "requestContext": {"resourcePath": "/healthz", "httpMethod": "GET", "stage": "snapstart", "requestId": "warm-up"},
}  # fmt: skip
MAX_REPLY_BYTES = 5 * 2**20
"""The largest reply body sent: Lambda refuses a response over 6 MB, the proxy's JSON envelope
included (which escapes every quote in the body)."""

SETTINGS = ExtenderSettings.from_env()
logger = Logger(service=SETTINGS.service)
metrics = Metrics(namespace=SETTINGS.metrics_namespace, service=SETTINGS.service)
tracer = make_tracer(SETTINGS.service)
tune_allocator()

SERVICE = build(
    SETTINGS,
    telemetry=EmfTelemetry(metrics, namespace=SETTINGS.metrics_namespace, service=SETTINGS.service),
    logger=logger,
    max_reply_bytes=MAX_REPLY_BYTES,
    trace=lambda name: tracer.provider.in_subsegment(name=name),
)
EXTENDER = SERVICE.extender
app = APIGatewayRestResolver()

try:  # SnapStart's hooks: the library ships with Lambda's Python runtimes (and the dev environment)
    from snapshot_restore_py import register_after_restore, register_before_snapshot
except ImportError:  # pragma: no cover - anywhere else, nothing snapshots this process
    pass
else:
    register_before_snapshot(SERVICE.before_snapshot)
    register_after_restore(SERVICE.after_restore)

    def _resolve_once() -> None:
        """The event resolver's first call (it reads each route's type hints then): ``GET /healthz``,
        which records nothing."""
        app.resolve(_HEALTHZ_EVENT, None)  # type: ignore[arg-type]  # the route reads no context

    register_before_snapshot(_resolve_once)


def _verb_route(verb: str) -> Callable[[], Response[str]]:
    """The route of ``POST /<verb>``: the extender's answer to the request (``filter_route`` and so on)."""

    def route() -> Response[str]:
        return _answer(verb)

    route.__name__ = route.__qualname__ = f"{verb}_route"
    return route


for _verb in ("filter", "prioritize", "bind", "preempt"):
    app.post(f"/{_verb}")(_verb_route(_verb))


@app.get("/healthz")
def healthz() -> Response[str]:
    return _response(SERVICE.health())


@app.not_found
def not_found(_exc: Exception) -> Response[str]:
    event = app.current_event
    return _response(SERVICE.not_found(event.http_method, event.path))


@app.exception_handler(Exception)  # type: ignore[untyped-decorator]  # Powertools leaves it untyped
def internal_error(_exc: Exception) -> Response[str]:
    return _response(SERVICE.internal_error(app.current_event.path))


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
        return _response(SERVICE.bad_request(verb, "request body is marked base64-encoded but is not valid base64"))
    with tracer.provider.in_subsegment(name=f"## {verb}"):
        return _response(SERVICE.answer(verb, body, path=app.current_event.path))


def _response(answer: Answer) -> Response[str]:
    return Response(answer.status, "application/json", answer.body.decode())


def not_api_gateway(event: Any) -> str:
    """Why ``event`` is not an API Gateway REST proxy event (payload v1) the routes can read ("" when it is
    one): the function is invoked that way only, but anyone who may invoke it can send anything.

    >>> not_api_gateway({"httpMethod": "POST", "path": "/filter", "requestContext": {}, "body": "{}"})
    ''
    >>> not_api_gateway({"version": "2.0", "routeKey": "POST /filter"})
    'not an API Gateway REST proxy event: httpMethod is missing or not a string'
    """
    if not isinstance(event, dict):
        return f"not an API Gateway REST proxy event: a {type(event).__name__}, not an object"
    for key in ("httpMethod", "path"):
        if not isinstance(event.get(key), str):
            return f"not an API Gateway REST proxy event: {key} is missing or not a string"
    if not isinstance(event.get("requestContext"), dict):
        return "not an API Gateway REST proxy event: requestContext is missing or not an object"
    for key, kinds in (("headers", (dict, type(None))), ("body", (str, type(None)))):
        if key in event and not isinstance(event[key], kinds):
            return f"not an API Gateway REST proxy event: {key} is a {type(event[key]).__name__}"
    return ""


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    refused = not_api_gateway(event)
    if refused:  # a clean 400: Powertools' resolver would raise on it (KeyError: 'httpMethod')
        answer = SERVICE.bad_request("event", refused)
        return {"statusCode": answer.status, "headers": {"Content-Type": "application/json"},
                "body": answer.body.decode(), "isBase64Encoded": False}  # fmt: skip
    return app.resolve(event, context)
