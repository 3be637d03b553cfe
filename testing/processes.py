"""The harness's processes and loopback servers: a free port, a server in a thread, a process group
stopped (TERM, then KILL), and the tail of a process's log for error messages."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
from collections.abc import Callable
from contextlib import suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """Stop a process started in its own session, with everything it started: TERM, then KILL."""
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=15)


def log_tail(path: Path, lines: int) -> str:
    """The last ``lines`` of a log, on one line, for error messages ("" when there is none)."""
    text = path.read_text(errors="replace") if path.exists() else ""
    return " | ".join(text.strip().splitlines()[-lines:])


def serve_in_thread(
    handler: type[BaseHTTPRequestHandler], wrap: Callable[[socket.socket], socket.socket] | None = None
) -> ThreadingHTTPServer:
    """``handler`` on a free loopback port, served by a daemon thread of this process; ``wrap`` (TLS,
    say) replaces the listening socket first. Stop it with ``shutdown()`` and ``server_close()``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    if wrap is not None:
        server.socket = wrap(server.socket)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
