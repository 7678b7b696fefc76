"""A service of the host's own, listening on 0.0.0.0, that no project or build may read."""

from __future__ import annotations

import http.server
import socket
import threading

from conftest import free_port

SECRET = "host-only-secret-4711"


class HostService:
    """A service of the host's own, on 0.0.0.0, that no project or build may read."""

    def __init__(self):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                self.send_response(200)
                self.end_headers()
                self.wfile.write(SECRET.encode())

            def log_message(self, *args):
                pass

        self.port = free_port()
        self.server = http.server.ThreadingHTTPServer(("0.0.0.0", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def host_address() -> str:
    """The host's own address on its default route (what a container could dial)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the route's source
        return s.getsockname()[0]
