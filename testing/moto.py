"""moto in server mode, in its own process, on loopback: for tests and benchmarks that need a real HTTP
AWS endpoint (DESIGN section 7) without sharing the GIL with the threads that call it.

The server handles one request at a time. moto's DynamoDB checks a write's condition and then stores the
item with no lock between, so two concurrent conditional writes on one item can both succeed, the
second silently overwriting the first. Real DynamoDB makes each item's conditional write atomic; the GPU
ledger relies on that, and the 8-thread bind test once lost a pod's assignment to this race
(``tests/testing/test_moto.py`` shows it). Serialising the requests restores the contract.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

_SERVE = """
import sys, threading
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple

port, switch_interval = int(sys.argv[1]), float(sys.argv[2])
if switch_interval > 0:
    sys.setswitchinterval(switch_interval)
app = DomainDispatcherApplication(create_backend_app)
one_at_a_time = threading.Lock()

def serialised(environ, start_response):
    with one_at_a_time:
        return list(app(environ, start_response))

run_simple("127.0.0.1", port, serialised, threaded=True, request_handler=MotoRequestHandler)
"""


@contextmanager
def moto_server(*, switch_interval_s: float = 0.0) -> Iterator[str]:
    """Start moto's server on a free port; yield its URL; stop it.

    ``switch_interval_s`` > 0 sets the server's thread switch interval (``sys.setswitchinterval``); a tiny
    one makes races between its request threads likely, for the test that shows there are none.
    """
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-c", _SERVE, str(port), str(switch_interval_s)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
