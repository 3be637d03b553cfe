"""moto in server mode, in its own process, on loopback: for tests and benchmarks that need a real HTTP
AWS endpoint (DESIGN section 7) without sharing the GIL with the threads that call it.

The server handles one request at a time. moto's DynamoDB checks a write's condition and then stores the
item with no lock between, so two concurrent conditional writes on one item can both succeed, the
second silently overwriting the first. Real DynamoDB makes each item's conditional write atomic; the GPU
ledger relies on that, and the 8-thread bind test once lost a pod's assignment to this race
(``tests/testing/test_moto.py`` shows it). Serialising the requests restores the contract.

``enforce_iam=True`` turns on moto's IAM authentication in the server (``INITIAL_NO_AUTH_ACTION_COUNT=0``):
every request must then be signed with the keys of an IAM user of the server, and is checked against
that user's policies. :mod:`testing.iam` builds on it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parents[1]

_SERVE = """
import importlib, sys, threading
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple

port, switch_interval, setup = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
if switch_interval > 0:
    sys.setswitchinterval(switch_interval)
if setup:
    module, _, function = setup.partition(":")
    getattr(importlib.import_module(module), function)()
app = DomainDispatcherApplication(create_backend_app)
one_at_a_time = threading.Lock()

def serialised(environ, start_response):
    with one_at_a_time:
        return list(app(environ, start_response))

run_simple("127.0.0.1", port, serialised, threaded=True, request_handler=MotoRequestHandler)
"""


def aws_env(endpoint: str, region: str = "us-east-1") -> dict[str, str]:
    """The environment a process needs to reach moto's server at ``endpoint`` as if it were DynamoDB and
    S3: dummy credentials, a region, ``AWS_ENDPOINT_URL_DYNAMODB`` and ``AWS_ENDPOINT_URL_S3`` (boto3
    honours them)."""
    return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": region,
            "AWS_REGION": region, "AWS_ENDPOINT_URL_DYNAMODB": endpoint,
            "AWS_ENDPOINT_URL_S3": endpoint}  # fmt: skip


def dynamodb_client(endpoint: str) -> Any:
    """A boto3 DynamoDB client on moto's server at ``endpoint``, with :func:`aws_env`'s credentials."""
    return _client("dynamodb", endpoint)


def s3_client(endpoint: str) -> Any:
    """A boto3 S3 client on moto's server at ``endpoint``, with :func:`aws_env`'s credentials."""
    return _client("s3", endpoint)


def _client(service: str, endpoint: str) -> Any:
    import boto3

    env = aws_env(endpoint)
    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name=env["AWS_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )


@contextmanager
def moto_server(*, switch_interval_s: float = 0.0, enforce_iam: bool = False, setup: str = "") -> Iterator[str]:
    """Start moto's server on a free port; yield its URL; stop it.

    ``switch_interval_s`` > 0 sets the server's thread switch interval (``sys.setswitchinterval``); a tiny
    one makes races between its request threads likely, for the test that shows there are none.
    ``enforce_iam`` turns on moto's IAM authentication from the first request (see the module docstring).
    ``setup``, ``"module:function"``, is called in the server's process before it serves (this repository
    is on its path).
    """
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ)
    if enforce_iam:
        env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"  # moto's switch: check every request's signature and policy
    if setup:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO), env.get("PYTHONPATH", "")]))
    process = subprocess.Popen(
        [sys.executable, "-c", _SERVE, str(port), str(switch_interval_s), setup],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
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
