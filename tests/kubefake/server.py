"""HTTP on 127.0.0.1, so the real ``kubernetes`` and ``kubernetes_asyncio`` clients talk
to the fake.

Plain HTTP/1.0 (one request per connection). A watch answers 200 and streams one
JSON event per line until its ``timeoutSeconds`` ends, the client goes away or
the fake stops; a watch from a compacted resourceVersion gets a single ERROR
event carrying the 410 Expired Status, as the API server's watch cache answers
(the clients raise it as ApiException(410)).
"""

from __future__ import annotations

import http.server
import json
import select
import threading
import time
from typing import TYPE_CHECKING, Any

from tests.kubefake.resources import NoRouteError
from tests.kubefake.status import ApiError

if TYPE_CHECKING:
    from tests.kubefake.fake import KubeFake


def _closed(connection: Any) -> bool:
    """True when the client has closed its end (readable, and nothing to read)."""
    try:
        readable, _, _ = select.select([connection], [], [], 0)
        if not readable:
            return False
        import socket

        return connection.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def handler_for(fake: KubeFake) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> Any:
            length = int(self.headers.get("Content-Length", "0"))
            return json.loads(self.rfile.read(length)) if length else None

        def _serve(self) -> None:
            try:
                user = fake.authenticate(self.headers.get("Authorization"))
            except ApiError as exc:
                return self._send(exc.code, exc.body)
            query = self.path.partition("?")[2].lower()
            if self.command == "GET" and ("watch=true" in query or "watch=1" in query):
                return self._watch(user)
            code, answer = fake.request(
                self.command,
                self.path,
                user=user,
                body=self._body(),
                content_type=self.headers.get("Content-Type", "application/json"),
            )
            return self._send(code, answer)

        def _watch(self, user: str) -> None:
            try:
                watcher, info = fake.open_watch(self.path, user)
            except NoRouteError:
                return self._send(404, ApiError(404, "not found").body)
            except ApiError as exc:
                if exc.code != 410:
                    return self._send(exc.code, exc.body)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                event = {"type": "ERROR", "object": exc.body}
                self.wfile.write(json.dumps(event).encode() + b"\n")
                return None
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            timeout = float(info.query.get("timeoutSeconds") or 1800)
            deadline = time.monotonic() + timeout
            try:
                while time.monotonic() < deadline and not watcher.closed:
                    for event in fake.store.next_events(watcher, 0.1):
                        self.wfile.write(json.dumps(event).encode() + b"\n")
                        self.wfile.flush()
                    if _closed(self.connection):
                        break
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                fake.store.stop_watch(watcher)
            return None

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve  # noqa: N815

    return Handler


def serve(fake: KubeFake) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler_for(fake))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server
