"""``gpu-scheduler serve``: the extender service (``application/extender/service.py``, the Lambda's too)
behind a threaded HTTP/1.1 server, which only turns requests into its calls and its answers into replies.

kube-scheduler calls an extender synchronously, once per pod, over a keep-alive connection, so the
server:

- sets TCP_NODELAY on every connection (Python's default leaves Nagle on, and each small reply then
  waits ~40 ms for a delayed ACK: DESIGN section 8);
- writes the status line, headers and body in one ``send``;
- refuses a body over the limit from its ``Content-Length`` before reading it (the service's one rule);
- gives each request :data:`REQUEST_TIMEOUT_S` to arrive whole once its first line is in, and an idle
  connection :data:`IDLE_TIMEOUT_S` (a reaper thread shuts the socket of one past its time, which a
  per-read timeout cannot do against a client that sends a byte at a time); serves at most
  :data:`MAX_CONNECTIONS` connections at once (503 past that); and logs a client that resets or times
  out in one debug line.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from application.extender.service import ROUTED_VERBS, Answer, ExtenderService
from scheduler_core.extender.wire import STATUS, error_body
from scheduler_core.k8s.quantity import plain_int

log = logging.getLogger("gpu_scheduler.server")

MAX_CONNECTIONS = 256
"""Open connections served at once; one more is answered 503 and closed. kube-scheduler opens one per
request in flight: binds that wait for their GPU's reservation pod to report (up to 10 s) hold theirs, and
a burst of new GPUs had 64 of them answered 503 (the pods retried after a backoff, on other GPUs: 102 GPUs
for 400 quarter shares instead of 100). Past 256 it is a client holding threads, not a scheduler."""
REQUEST_TIMEOUT_S = 10.0
"""How long a request may take to arrive, from its first line to the end of its body: past
kube-scheduler's ``httpTimeout`` (3 s by default) nobody is waiting for the answer."""
IDLE_TIMEOUT_S = 60.0
"""How long a keep-alive connection may wait for its next request. Longer than the request's limit:
closing a connection Go's client is about to reuse fails that POST (Go does not replay one)."""


class ExtenderHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self, address: tuple[str, int], service: ExtenderService, *, max_connections: int = MAX_CONNECTIONS
    ) -> None:
        self.service = service
        self.requests: Counter[tuple[str, int]] = Counter()  # (verb, status) -> replies
        self._requests_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_connections)
        self._deadlines: dict[Any, float] = {}  # connection -> when the reaper shuts it
        self._deadlines_lock = threading.Lock()
        self._closed = threading.Event()
        super().__init__(address, ExtenderRequestHandler)
        threading.Thread(target=self._reap, name="serve-reaper", daemon=True).start()

    def arm(self, connection: Any, seconds: float) -> None:
        """Shut ``connection`` unless it is disarmed (or armed anew) within ``seconds``."""
        with self._deadlines_lock:
            self._deadlines[connection] = time.monotonic() + seconds

    def disarm(self, connection: Any) -> None:
        with self._deadlines_lock:
            self._deadlines.pop(connection, None)

    def _reap(self, every_s: float = 0.2) -> None:
        while not self._closed.wait(every_s):
            now = time.monotonic()
            with self._deadlines_lock:  # held while shutting: a handler that disarms meanwhile keeps its socket
                overdue = [c for c, at in self._deadlines.items() if at < now]
                for connection in overdue:
                    del self._deadlines[connection]
                    with contextlib.suppress(OSError):
                        connection.shutdown(socket.SHUT_RDWR)  # the handler's read returns, and it ends

    def server_close(self) -> None:
        self._closed.set()
        super().server_close()

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread per connection, up to ``max_connections``; past that a 503 on the accepting thread."""
        if not self._slots.acquire(blocking=False):
            with contextlib.suppress(OSError):
                request.sendall(_BUSY)
            self.shutdown_request(request)
            self.count("other", STATUS["unavailable"])
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that resets, times out or goes away is routine: one debug line, not a traceback."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            log.debug("connection from %s ended: %s", client_address, exc)
        else:
            log.exception("error serving %s", client_address)

    def count(self, verb: str, status: int) -> None:
        with self._requests_lock:
            self.requests[(verb if verb in ROUTED_VERBS else "other", status)] += 1

    def metrics_text(self) -> str:
        """``GET /metrics``: the replies by verb and status (this server's own count, 503s included), then
        the service's metrics: the Lambda's EMF set under Prometheus names, and the live state's."""
        with self._requests_lock:
            counts = sorted(self.requests.items())
        lines = [f'gpu_scheduler_extender_requests_total{{verb="{verb}",status="{status}"}} {n}'
                 for (verb, status), n in counts]  # fmt: skip
        return "\n".join(lines) + ("\n" if lines else "") + self.service.metrics_text()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"


_BUSY_BODY = b'{"Error": "the extender has too many open connections; retry"}'
_BUSY = (
    f"HTTP/1.1 {STATUS['unavailable']} {HTTPStatus(STATUS['unavailable']).phrase}\r\n".encode()
    + b"Content-Type: application/json\r\nConnection: close\r\n"
    + b"Content-Length: "
    + str(len(_BUSY_BODY)).encode()
    + b"\r\n\r\n"
    + _BUSY_BODY
)


class Headers(dict[str, str]):
    """Request headers by lower-cased name: what the handler reads, without the email parser
    ``http.server`` uses (a fifth of a request's time here, measured with py-spy under load)."""

    def get(self, name: str, default: Any = None) -> Any:
        return super().get(name.lower(), default)


MAX_HEADER_LINE = 65536  # http.client's own limits
MAX_HEADERS = 100


class ExtenderRequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # TCP_NODELAY on the connection socket
    timeout = IDLE_TIMEOUT_S  # each read's own limit (socketserver sets it on the socket)
    request_timeout_s: float = REQUEST_TIMEOUT_S
    server: ExtenderHTTPServer
    raw_requestline: bytes  # set by BaseHTTPRequestHandler.handle_one_request before parse_request

    def parse_request(self) -> bool:
        """The request line and headers, as ``BaseHTTPRequestHandler.parse_request`` reads them for the
        requests an extender gets (HTTP/1.0 and 1.1), into :class:`Headers`."""
        self.command = None  # type: ignore[assignment]  # set in case of an error on the first line
        # Not the base class's HTTP/0.9 default, under which a malformed first line ("GET /", junk) got a
        # bare body with no status line.
        self.request_version = "HTTP/1.0"
        self.close_connection = True
        self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        words = self.requestline.split()
        if len(words) != 3 or words[2] not in ("HTTP/1.0", "HTTP/1.1"):
            self.send_error(HTTPStatus.BAD_REQUEST, f"Bad request line ({self.requestline[:100]!r})")
            return False
        self.command, self.path, self.request_version = words
        self.close_connection = self.request_version == "HTTP/1.0"
        headers = Headers()
        self.server.arm(self.connection, self.request_timeout_s)  # the rest of the request, in all
        for _ in range(MAX_HEADERS + 1):
            line = self.rfile.readline(MAX_HEADER_LINE + 1)
            if len(line) > MAX_HEADER_LINE:
                self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Line too long")
                return False
            if line in (b"\r\n", b"\n", b""):
                break
            name, sep, value = line.decode("iso-8859-1").partition(":")
            if not sep:
                self.send_error(HTTPStatus.BAD_REQUEST, f"Bad header line ({line[:100]!r})")
                return False
            headers[name.strip().lower()] = value.strip()
        else:
            self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Too many headers")
            return False
        self.headers = headers  # type: ignore[assignment]
        if self.command != "POST":
            self.server.disarm(self.connection)
        connection = headers.get("Connection", "").lower()
        if connection == "close":
            self.close_connection = True
        elif connection == "keep-alive":
            self.close_connection = False
        if headers.get("Expect", "").lower() == "100-continue" and self.request_version == "HTTP/1.1":
            return bool(self.handle_expect_100())
        return True

    def do_POST(self) -> None:
        service = self.server.service
        path = self.path.split("?", 1)[0]
        verb = path.rstrip("/").rsplit("/", 1)[-1]  # any URL prefix: kube-scheduler POSTs <urlPrefix>/<verb>
        raw_length = self.headers.get("Content-Length")
        length = plain_int(raw_length.strip()) if raw_length is not None else None
        refused: Answer | None = None
        if verb not in ROUTED_VERBS:
            refused = service.not_found("POST", path)
        elif length is None:
            refused = service.bad_request(verb, "a Content-Length header with the body size is required")
        else:
            refused = service.refuse_length(verb, length)
        if refused is not None:
            # Do not read (or keep) a body we will not use; close so the unread bytes go with it.
            self.close_connection = True
            self._reply(refused, verb=verb)
            return
        assert length is not None  # refused above otherwise
        body = self.rfile.read(length)
        self.server.disarm(self.connection)  # what follows is the extender's time, not the client's
        if len(body) != length:  # the client went, or the reaper cut it off: nobody to answer
            self.close_connection = True
            return
        started = time.perf_counter()
        answer = service.answer(verb, body, path=path)
        log.debug("%s %s -> %d in %.2f ms", self.command, path, answer.status, 1000 * (time.perf_counter() - started))
        self._reply(answer, verb=verb)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        service = self.server.service
        if path.rstrip("/") == "/healthz":
            self._reply(service.health())
        elif path.rstrip("/") == "/metrics":
            metrics = Answer(STATUS[""], self.server.metrics_text().encode())
            self._reply(metrics, content_type="text/plain; version=0.0.4")
        else:
            self._reply(service.not_found("GET", path))

    def handle(self) -> None:
        """``BaseHTTPRequestHandler.handle``, with the idle wait before each request bounded in all."""
        self.close_connection = True
        try:
            while True:
                self.server.arm(self.connection, IDLE_TIMEOUT_S if self.timeout is None else self.timeout)
                self.handle_one_request()
                if self.close_connection:
                    break
        finally:
            self.server.disarm(self.connection)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Every refusal the request's own parsing makes (a bad first line, a header too long, a method with
        no handler), as the rest are answered: a status line, and ``{"Error": ...}``; the connection closes."""
        self.close_connection = True
        self._reply(Answer(int(code), error_body(message or HTTPStatus(code).phrase)))

    def _reply(self, answer: Answer, content_type: str = "application/json", verb: str | None = None) -> None:
        """Write the answer; with ``verb``, count it first, so that ``/metrics`` read after it includes it."""
        status, payload = answer.status, answer.body
        if verb is not None:
            self.server.count(verb, status)
        head = (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
            f"Content-Type: {content_type}\r\n"
            f"Content-Length: {len(payload)}\r\n" + ("Connection: close\r\n" if self.close_connection else "") + "\r\n"
        )
        self.wfile.write(head.encode("latin-1") + payload)
        self.log_request(status, len(payload))

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature fixed by the base class
        log.debug("%s - %s", self.address_string(), format % args)


def serve(service: ExtenderService, host: str, port: int, *, ready: Callable[[str], None] | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then stop accepting, close the socket and return. ``GET /metrics``
    answers :meth:`ExtenderHTTPServer.metrics_text`.

    Handler threads are daemons: an idle keep-alive connection must not hold up the exit.
    """
    server = ExtenderHTTPServer((host, port), service)
    stop = threading.Event()

    def _shutdown(signum: int, _frame: Any) -> None:
        if not stop.is_set():
            stop.set()
            log.info("signal %d: shutting down", signum)
            # shutdown() blocks until serve_forever returns, so it must run off the serving thread.
            threading.Thread(target=server.shutdown, daemon=True).start()

    previous = {sig: signal.signal(sig, _shutdown) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if ready is not None:
            ready(server.url)
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def print_ready(url: str) -> None:
    """Announce the bound address on stdout (the demo and tests read this line)."""
    sys.stdout.write(json.dumps({"serving": url, "pid": os.getpid()}) + "\n")
    sys.stdout.flush()
