"""Plumbing for HTTP-level fakes of the Kubernetes API (no API server runs here).

A test module subclasses ``JsonHandler`` with the routes it needs and serves it
with ``kube_client``, which yields an official ``kubernetes`` ApiClient pointed
at the fake on 127.0.0.1 and stops the server afterwards.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any


class JsonHandler(http.server.BaseHTTPRequestHandler):
    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length", "0"))
        return json.loads(self.rfile.read(length)) if length else None

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def kube_client(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[Any]:
    from kubernetes import client

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = client.Configuration()
    config.host = f"http://127.0.0.1:{server.server_port}"
    try:
        yield client.ApiClient(config)
    finally:
        server.shutdown()
        server.server_close()
