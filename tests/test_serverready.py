"""The spawner's wait for a started project server (gpulab_hub.serverready): it sees the
server within a poll of it coming up, where JupyterHub's back-off could look seconds
later; a 5xx is not an answer; nothing listening is a False within the timeout."""

from __future__ import annotations

import asyncio
import socket
import time

from tornado.httpserver import HTTPServer
from tornado.web import Application, RequestHandler

from gpulab_hub import serverready


class Hello(RequestHandler):
    def get(self):
        self.redirect("/elsewhere")  # a login redirect is an answer, as JupyterHub counts it


class Broken(RequestHandler):
    def get(self):
        self.set_status(503)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_server_coming_up_late_is_seen_within_a_poll():
    port = free_port()
    server = HTTPServer(Application([(r"/api", Hello)]))
    up_after = 0.7

    async def come_up():
        await asyncio.sleep(up_after)
        server.listen(port, "127.0.0.1")
        return time.monotonic()

    t0 = time.monotonic()
    up = asyncio.ensure_future(come_up())
    try:
        assert await serverready.answers(f"http://127.0.0.1:{port}/api", timeout=10)
        seen = time.monotonic()
        # JupyterHub's back-off looks at about 0.2, 0.6, 1.4 s (with jitter): a server up
        # at 0.7 s could be seen at 1.4 s; the spawner's wait sees it within a poll.
        assert seen - await up < 0.5, f"seen {seen - t0:.2f} s after the wait began"
    finally:
        server.stop()


async def test_a_5xx_is_not_an_answer_and_silence_ends_at_the_timeout():
    port = free_port()
    server = HTTPServer(Application([(r"/api", Broken)]))
    server.listen(port, "127.0.0.1")
    try:
        t0 = time.monotonic()
        assert not await serverready.answers(f"http://127.0.0.1:{port}/api", timeout=0.6)
        assert 0.5 < time.monotonic() - t0 < 3
    finally:
        server.stop()
    t0 = time.monotonic()
    assert not await serverready.answers(f"http://127.0.0.1:{free_port()}/api", timeout=0.4)
    assert time.monotonic() - t0 < 3
