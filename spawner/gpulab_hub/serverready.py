"""Until a started project server answers: polled every POLL_S, so the hub moves the
person on to JupyterLab within a tenth of a second of the server being up.

JupyterHub waits for a started server itself (``Server.wait_up``), with exponential
back-off and jitter (0.2 s, 0.4 s, 0.8 s, 1.6 s …): a server that comes up 2.5 s after
its container started is seen up to 3 s later, time the person watches the spawn page.
gpulab's spawner waits first, with a short poll, and returns once the server answers,
so JupyterHub's first look finds it up. Any answer but a 5xx counts, as JupyterHub
counts them; a server that never answers is left to JupyterHub's own wait and its
``http_timeout``.
"""

from __future__ import annotations

import asyncio
import time

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

POLL_S = 0.05
REQUEST_TIMEOUT_S = 2.0


async def answers(url: str, timeout: float, poll: float = POLL_S) -> bool:
    """Whether the server at ``url`` answered (any status below 500) within ``timeout``
    seconds. Never raises for a server that is not there yet."""
    client = AsyncHTTPClient()
    deadline = time.monotonic() + timeout
    while True:
        request = HTTPRequest(
            url,
            follow_redirects=False,
            connect_timeout=REQUEST_TIMEOUT_S,
            request_timeout=REQUEST_TIMEOUT_S,
        )
        try:
            response = await client.fetch(request, raise_error=False)
            if response.code < 500:  # (599: no answer at all)
                return True
        except (TimeoutError, HTTPClientError, OSError):
            pass
        if time.monotonic() + poll > deadline:
            return False
        await asyncio.sleep(poll)
