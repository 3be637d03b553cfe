"""What a failed bind answers: the step that failed and its cause, in a few fixed words a tenant may read.

A failed bind's ``Error`` reaches kube-scheduler and, from there, the pod's events, which its tenant
reads: ``bind NS/NAME to NODE: step: cause`` ("the GPU ledger write failed: throttled, try again",
"posting the Binding failed: HTTP 403 Forbidden"), never the table, an ARN, the API server's or
DynamoDB's own text, or another pod's details. The binder logs those (``shares/binder.py``).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from adapters.gpu_ledger import LedgerConflictError, LedgerStoreError, NoRoomError
from adapters.kube_transport import DeadlineReachedError, KubeApiError
from scheduler_core.extender.facade import BindOutcome
from scheduler_core.extender.wire import ExtenderBindingArgs
from shares.ledger_writes import BusyError

NO_SUCH_POD = "no pod with that namespace, name and UID"
"""The answer for a pod that does not exist and for one whose UID is another: the same, so that bind is
no oracle for which pods exist in which namespace."""
_THROTTLED = frozenset(
    {"ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded", "LimitExceededException"}
)


def pod_key_of(args: ExtenderBindingArgs) -> str:
    """``NS/NAME`` of the pod a bind is for."""
    return f"{args.pod_namespace}/{args.pod_name}"


def failed_bind(args: ExtenderBindingArgs, kind: str, message: str, **extra: Any) -> BindOutcome:
    """A failed bind's answer: ``bind NS/NAME to NODE: message``, and its kind for the metrics."""
    return BindOutcome(pod_key_of(args), args.node, f"bind {pod_key_of(args)} to {args.node}: {message}", kind, **extra)


def refused(exc: KubeApiError | DeadlineReachedError) -> bool:
    """Whether a failed Binding certainly did not land: the API server refused it (a 4xx, throttling
    included), or nothing was sent (a deadline reached before the first attempt), or the deadline came
    after a refusal. A transport error or a 5xx may have landed."""
    if isinstance(exc, DeadlineReachedError):
        cause = exc.__cause__
        return cause is None or (isinstance(cause, KubeApiError) and refused(cause))
    return 400 <= exc.status < 500


def short(exc: Exception) -> str:
    """What went wrong, in words a tenant may read (see the module docstring)."""
    if isinstance(exc, DeadlineReachedError):
        return "the bind ran out of time; kube-scheduler will retry the pod"
    if isinstance(exc, KubeApiError):
        if exc.status == 0:
            return "the API server could not be reached"
        try:
            phrase = HTTPStatus(exc.status).phrase
        except ValueError:
            phrase = "error"
        return f"HTTP {exc.status} {phrase}"
    if isinstance(exc, NoRoomError):
        return "the pod's GPUs do not fit in what this node has free; kube-scheduler will retry the pod"
    if isinstance(exc, LedgerConflictError):
        return f"{exc.conflicts} conflicting writes by other binds to this node; kube-scheduler will retry the pod"
    if isinstance(exc, BusyError):
        return "other binds to this node held it for the bind's whole budget; kube-scheduler will retry the pod"
    if isinstance(exc, LedgerStoreError):
        return ledger_cause(exc)
    return "internal error; see the extender's log"


def ledger_cause(exc: LedgerStoreError) -> str:
    """A DynamoDB failure in fixed words: throttled, unreachable, or otherwise (the log has the rest)."""
    cause = exc.__cause__
    if isinstance(cause, ClientError):
        if cause.response.get("Error", {}).get("Code") in _THROTTLED:
            return "throttled, try again"
        return "DynamoDB refused the request; see the extender's log"
    if isinstance(cause, BotoCoreError):
        return "DynamoDB did not answer in time, try again"
    return "the node's ledger item could not be read; see the extender's log"
