"""The harness's own client of the API server: JSON over one keep-alive HTTPS connection per thread,
and the error an API server's failure status becomes."""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import urllib.parse
from collections.abc import Sequence
from typing import Any


class KubeError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, body: Any, what: str) -> None:
        message = body.get("message") if isinstance(body, dict) else str(body)[:300]
        super().__init__(f"{what}: HTTP {status}: {message}")
        self.status, self.body = status, body


class KubeRest:
    """A small JSON client for the harness itself: one keep-alive HTTPS connection per thread."""

    def __init__(self, url: str, token: str) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 443
        self.token = token
        self._context = ssl.create_default_context()
        self._context.check_hostname = False
        self._context.verify_mode = ssl.CERT_NONE  # a loopback apiserver with a self-signed certificate
        self._local = threading.local()

    def _connection(self) -> http.client.HTTPSConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPSConnection(self.host, self.port, context=self._context, timeout=60)
            self._local.conn = conn
        return conn

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        ok: Sequence[int] = (200, 201),
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        status, raw = self.raw(method, path, data, content_type)
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode(errors="replace")
        if status not in ok:
            raise KubeError(status, parsed, f"{method} {path}")
        return parsed

    def raw(self, method: str, path: str, data: bytes | None = None, content_type: str = "") -> tuple[int, bytes]:
        """The status and body bytes of one request (retried once on a dropped keep-alive connection)."""
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                return response.status, response.read()
            except (http.client.HTTPException, OSError):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def items(self, path: str) -> list[dict[str, Any]]:
        """Every item of a list, following ``continue``."""
        found: list[dict[str, Any]] = []
        token = ""
        while True:
            separator = "&" if "?" in path else "?"
            page = self.get(f"{path}{separator}limit=500" + (f"&continue={urllib.parse.quote(token)}" if token else ""))
            found.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return found

    def patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")
