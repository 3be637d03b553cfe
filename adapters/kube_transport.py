"""One call to the Kubernetes API, made safe: bounded retries, errors read from the server's ``Status``, and
raw JSON decoded without the generated client's model objects.

:class:`KubeTransport` is what :class:`adapters.kube.KubeClient` makes each of its calls through:

- 409, 429 and 5xx (and dropped connections) are retried with bounded, jittered exponential backoff
  that honours ``Retry-After`` and never runs past the caller's deadline (:class:`DeadlineReachedError`);
- what is left is raised as :class:`KubeApiError`, carrying the code, reason and message from the
  server's ``Status`` (:class:`ListExpiredError` for a 410);
- bodies and watch streams are read as raw JSON (``_preload_content=False``) and decoded with ``msgspec``,
  into a TypedDict of :mod:`adapters.kube_types` where the caller names one.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypedDict

from adapters.errors import AdapterError
from adapters.kube_types import list_type

# Logged under the client's name, where these lines were logged before the transport had a module of its own.
log = logging.getLogger("adapters.kube")

RETRIED_STATUSES = frozenset({409, 429, 500, 502, 503, 504})


class KubeApiError(AdapterError):
    """The API answered with an error, or could not be reached, after any retries."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else message)
        self.status, self.reason, self.message = status, reason, message


class ListExpiredError(KubeApiError):
    """410: the continue token outlived the server's snapshot; the list must start again."""


class DeadlineReachedError(AdapterError):
    """Not enough time is left to make (or retry) the call."""


@dataclass
class RetryPolicy:
    attempts: int = 4
    base_s: float = 0.2
    max_s: float = 5.0
    request_timeout_s: float = 30.0


class KubeTransport:
    """Calls of the generated client's methods, on raw JSON, with retries bounded by an optional deadline.

    Parameters
    ----------
    retry : the attempts and the backoff between them, and each request's timeout
    deadline : callable returning the seconds left, or None for no deadline. A call is not started
        (nor retried) with less than ``min_call_s`` left; :class:`DeadlineReachedError` is raised instead.
    """

    def __init__(
        self,
        *,
        retry: RetryPolicy | None = None,
        deadline: Callable[[], float] | None = None,
        min_call_s: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.retry = retry or RetryPolicy()
        self.deadline = deadline
        self.min_call_s = min_call_s
        self._sleep = sleep
        self.retries = 0

    def _stream(
        self, method: Callable[..., Any], what: str, item_type: Any, **kwargs: Any
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(type, object)`` for each event of the watch that ``method(**kwargs)`` opens, the object decoded
        into ``item_type`` where it fits; not retried. A refusal, an ``ERROR`` event (its ``Status``) or a
        stream that breaks off (``what`` broke off) is a :class:`KubeApiError`; a 410, a
        :class:`ListExpiredError`."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError as TransportError

        try:
            response = method(_preload_content=False, **kwargs)
        except ApiException as exc:
            raise _api_error(exc) from exc
        except TransportError as exc:
            raise KubeApiError(0, "Unreachable", f"the API server could not be reached: {exc}") from exc
        try:
            for line in _lines(response):
                event = _decode_event(line, item_type)
                kind_of = str(event.get("type") or "")
                obj = event.get("object") or {}
                if kind_of == "ERROR":
                    code = int(obj.get("code") or 0)
                    error = ListExpiredError if code == 410 else KubeApiError
                    raise error(code, str(obj.get("reason") or "Error"), str(obj.get("message") or ""))
                yield kind_of, obj
        except TransportError as exc:
            raise KubeApiError(0, "StreamBroken", f"{what} broke off: {exc}") from exc
        finally:
            response.close()
            response.release_conn()

    def _json(
        self,
        method: Callable[..., Any],
        *args: Any,
        _retry_409: bool = True,
        _retry_429: bool = True,
        _item_type: Any = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The body ``method(*args, **kwargs)`` answers, decoded (a list page into ``_item_type``'s list type
        where given), retried as the module docstring says; a 409 only with ``_retry_409``, a 429 only with
        ``_retry_429`` (an eviction's 429 is a PodDisruptionBudget's no)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError as TransportError

        policy = self.retry
        last: KubeApiError | None = None  # what the previous attempt got: a DeadlineReachedError's cause
        for attempt in range(policy.attempts):
            try:
                timeout = self._time_for_call()
            except DeadlineReachedError as exc:
                raise exc from last  # no cause: nothing was sent
            try:
                response = method(*args, _preload_content=False, _request_timeout=timeout, **kwargs)
                return _decode(response.data, _item_type)
            except ApiException as exc:
                error = _api_error(exc)
                retryable = (
                    exc.status in RETRIED_STATUSES
                    and (exc.status != 409 or _retry_409)
                    and (exc.status != 429 or _retry_429)
                )
                if not retryable or attempt == policy.attempts - 1:
                    raise error from exc
                wait = _retry_after(exc.headers) or _backoff(policy, attempt)
                log.info("retrying after %s (attempt %d): waiting %.2f s", error, attempt + 1, wait)
                last = error
            except TransportError as exc:
                last = KubeApiError(0, "Unreachable", f"the API server could not be reached: {exc}")
                if attempt == policy.attempts - 1:
                    raise last from exc
                wait = _backoff(policy, attempt)
            self.retries += 1
            try:
                self._wait(wait)  # a Retry-After longer than the time left fails now, not after it
            except DeadlineReachedError as exc:
                raise exc from last
        raise AssertionError("unreachable")

    def _time_for_call(self) -> float:
        timeout = self.retry.request_timeout_s
        if self.deadline is None:
            return timeout
        left = self.deadline()
        if left < self.min_call_s:
            raise DeadlineReachedError(f"{left:.1f} s left, under the {self.min_call_s:.1f} s a call needs")
        return min(timeout, left)

    def _wait(self, seconds: float) -> None:
        if self.deadline is not None and self.deadline() - seconds < self.min_call_s:
            raise DeadlineReachedError("no time left to retry")
        self._sleep(seconds)


_DECODERS: dict[Any, Any] = {}
_EVENT_DECODERS: dict[Any, Any] = {}


def _lines(response: Any) -> Iterator[bytes]:
    """The newline-delimited JSON of a watch, line by line, as the chunks arrive."""
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=False):
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        yield from (line for line in lines if line.strip())
    if buffer.strip():
        yield buffer


def _decode_event(line: bytes, item_type: Any) -> dict[str, Any]:
    """One watch event: ``object`` decoded into ``item_type`` when it fits (an ERROR's Status does not)."""
    import msgspec

    if item_type is not None:
        decoder = _EVENT_DECODERS.get(item_type)
        if decoder is None:
            make: Any = TypedDict  # built at run time: the item type is a parameter
            event_type = make(f"EventOf{item_type.__name__}", {"type": str, "object": item_type}, total=False)
            decoder = _EVENT_DECODERS[item_type] = msgspec.json.Decoder(event_type)
        try:
            typed: dict[str, Any] = decoder.decode(line)
            return typed
        except msgspec.ValidationError:
            pass
    try:
        event: dict[str, Any] = msgspec.json.decode(line)
    except msgspec.DecodeError as exc:
        raise KubeApiError(0, "BadResponse", f"a watch event that is not JSON: {exc}") from exc
    return event


def _decode(data: bytes, item_type: Any) -> dict[str, Any]:
    import msgspec

    if item_type is not None:
        decoder = _DECODERS.get(item_type)
        if decoder is None:
            decoder = _DECODERS[item_type] = msgspec.json.Decoder(list_type(item_type))
        try:
            typed: dict[str, Any] = decoder.decode(data)
            return typed
        except msgspec.ValidationError as exc:
            log.warning("a list page does not fit %s (%s); decoding it in full", item_type.__name__, exc)
    try:
        body: dict[str, Any] = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise KubeApiError(0, "BadResponse", f"the API server sent a body that is not JSON: {exc}") from exc
    return body


def _api_error(exc: Any) -> KubeApiError:
    status = int(exc.status or 0)
    reason, message = str(exc.reason or ""), ""
    try:
        body = json.loads(exc.body or b"{}")
        if isinstance(body, dict):
            reason = str(body.get("reason") or reason)
            message = str(body.get("message") or "")
    except (TypeError, ValueError):
        message = str(exc.body or "")[:200]
    kind = ListExpiredError if status == 410 else KubeApiError
    return kind(status, reason, message or reason)


def _retry_after(headers: Any) -> float | None:
    raw = (headers or {}).get("Retry-After")
    try:
        return min(float(raw), 10.0) if raw is not None else None
    except ValueError:
        return None


def _backoff(policy: RetryPolicy, attempt: int) -> float:
    # Full jitter: spreads the retries of concurrent refreshers instead of synchronising them.
    return random.uniform(0, min(policy.max_s, policy.base_s * 2**attempt))


# urllib3 warns of each of its own retries ("Retrying (Retry(total=2...))"), three lines per failed call; the
# client's callers retry with backoff and say so once (adapters.cluster_mirror), so only its errors are shown.
logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
