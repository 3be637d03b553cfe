"""An HTTPS proxy in front of a test API server that answers some requests with a fault of its choosing.

The product's client is pointed at it through a kubeconfig (``kubeconfig()``); every request goes on to
the API server unchanged, except those :attr:`FaultProxy.fault` claims. Its certificate is self-signed
(``openssl``), which the kubeconfig's ``insecure-skip-tls-verify`` accepts, as for the API server itself.
Streams (watches) are not proxied: point a watch at the API server directly.
"""

from __future__ import annotations

import json
import ssl
import subprocess
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import yaml

from testing.credentials import kubeconfig
from testing.kube_rest import KubeRest
from testing.processes import serve_in_thread

Fault = Callable[[str, str], tuple[str, int] | None]
"""``(method, path)`` to None (forward it), or ``(when, status)``: ``"instead"`` answers ``status`` without
forwarding; ``"after"`` forwards it, then answers ``status`` in place of the API server's reply (a
reply lost on the way back)."""


class FaultProxy:
    def __init__(self, api: KubeRest, workdir: Path, token: str) -> None:
        self.api, self.token = api, token
        self.fault: Fault = lambda _method, _path: None
        self.seen: list[tuple[str, str, int]] = []  # (method, path, status answered)
        key, cert = workdir / "proxy.key", workdir / "proxy.crt"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
             "-days", "1", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True,
        )  # fmt: skip
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        handler = type("BoundFaultHandler", (_Handler,), {"proxy": self})
        self.server = serve_in_thread(handler, lambda sock: context.wrap_socket(sock, server_side=True))
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        self.kubeconfig = workdir / "proxy-kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump(kubeconfig(self.url, token)))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    proxy: FaultProxy

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
        fault = self.proxy.fault(self.command, self.path)
        if fault is None or fault[0] == "after":
            status, raw = self.proxy.api.raw(self.command, self.path, body, self.headers.get("Content-Type") or "")
        if fault is not None:
            status = fault[1]
            raw = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": status,
                              "reason": "Conflict" if status == 409 else "InternalError",
                              "message": f"injected by the test's fault proxy: {status}"}).encode()  # fmt: skip
        self.proxy.seen.append((self.command, self.path, status))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        self._forward()

    def do_POST(self) -> None:
        self._forward()

    def do_PUT(self) -> None:
        self._forward()

    def do_PATCH(self) -> None:
        self._forward()

    def do_DELETE(self) -> None:
        self._forward()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
        pass
