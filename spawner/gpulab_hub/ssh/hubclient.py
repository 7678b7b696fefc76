"""The SSH gateway's calls to the hub's REST API, with the gateway service's token.

- :meth:`HubClient.access`: gpulab's access API (ssh/hubapi.py): may this user open a
  shell in that project, and where is its container;
- :meth:`HubClient.whoami`: whose hub API token a password is (``GET /user`` with it);
- :meth:`HubClient.start` and :meth:`HubClient.progress`: JupyterHub's own API to start
  a stopped project and follow its start;
- :meth:`HubClient.projects`: the names of a user's own projects (JupyterHub's user
  model, stopped servers included), for a login that named none;
- :meth:`HubClient.activity`: mark a project's server active (an SSH session is open in
  it; JupyterHub's ``POST /users/<owner>/activity``);
- :meth:`HubClient.session_env`: the environment the project's sessions get from the
  user's secrets (``GET /gpulab/secrets/<owner>/<project>?for=<user>``; none where the
  hub has no such API).

One tornado HTTP client for all of them; names in URLs are quoted whole.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from urllib.parse import quote, urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from gpulab_hub.ssh import access_url

TIMEOUT_S = 20
MAX_ANSWER = 1 << 20  # bytes of one answer read at most
MAX_EVENT_LINE = 64 * 1024


class HubError(Exception):
    """The hub did not answer as expected; ``str()`` is for the log, not for users."""


def _q(name: str) -> str:
    return quote(name, safe="")


class HubClient:
    def __init__(self, api_url: str, token: str, max_clients: int = 64):
        self.api = api_url.rstrip("/")
        self._token = token
        self._http = AsyncHTTPClient(force_instance=True, max_clients=max_clients)

    def _headers(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"token {token or self._token}", "Accept": "application/json"}

    async def _json(self, method: str, url: str, token: str | None = None, body=None):
        """(status, parsed JSON or None) of one call; HubError if the hub is unreachable."""
        request = HTTPRequest(
            url,
            method=method,
            headers=self._headers(token),
            body=None if body is None else json.dumps(body),
            request_timeout=TIMEOUT_S,
            connect_timeout=TIMEOUT_S,
            follow_redirects=False,
        )
        try:
            response = await self._http.fetch(request, raise_error=False)
        except (TimeoutError, OSError, HTTPClientError) as e:
            raise HubError(f"{method} {url}: {type(e).__name__}: {e}") from e
        if response.code == 599:
            raise HubError(f"{method} {url}: {response.error}")
        data = None
        raw = response.body or b""
        if raw and len(raw) <= MAX_ANSWER:
            try:
                data = json.loads(raw)
            except ValueError:
                data = None
        return response.code, data

    async def access(self, user: str, owner: str, project: str) -> dict:
        """The hub's access answer (ssh/hubapi.py) for ``user`` in ``owner``'s ``project``."""
        url = access_url(self.api, user, owner, project)
        code, data = await self._json("GET", url)
        if code != 200 or not isinstance(data, dict):
            raise HubError(f"access API answered {code}")
        return data

    async def whoami(self, token: str) -> dict | None:
        """The hub's user model of ``token`` (with its ``scopes``), None if the hub does
        not know the token."""
        code, data = await self._json("GET", f"{self.api}/user", token=token)
        if code in (401, 403):
            return None
        if code != 200 or not isinstance(data, dict):
            raise HubError(f"GET /user answered {code}")
        return data

    async def start(self, owner: str, project: str) -> tuple[int, str]:
        """Ask JupyterHub to start ``owner``'s ``project``: (status, its message).
        201/202: starting or started; 400: already starting or running."""
        url = f"{self.api}/users/{_q(owner)}/servers/{_q(project)}"
        code, data = await self._json("POST", url, body={})
        message = data.get("message", "") if isinstance(data, dict) else ""
        return code, message if isinstance(message, str) else ""

    async def progress(self, owner: str, project: str, timeout_s: float) -> AsyncIterator[dict]:
        """The project's start events (JupyterHub's progress event stream), as they come,
        until it is ready or failed, or ``timeout_s`` passes."""
        url = f"{self.api}/users/{_q(owner)}/servers/{_q(project)}/progress"
        queue: asyncio.Queue = asyncio.Queue()
        buffer = bytearray()

        def chunk(data: bytes) -> None:
            buffer.extend(data)
            while b"\n" in buffer:
                line, _, rest = bytes(buffer).partition(b"\n")
                buffer[:] = rest
                if line.startswith(b"data:"):
                    try:
                        event = json.loads(line[5:])
                    except ValueError:
                        continue
                    if isinstance(event, dict):
                        queue.put_nowait(event)
            if len(buffer) > MAX_EVENT_LINE:
                buffer.clear()

        request = HTTPRequest(
            url,
            headers={**self._headers(), "Accept": "text/event-stream"},
            streaming_callback=chunk,
            request_timeout=timeout_s,
            connect_timeout=TIMEOUT_S,
        )
        fetch = asyncio.ensure_future(self._http.fetch(request, raise_error=False))
        try:
            while True:
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({getter, fetch}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    event = getter.result()
                    yield event
                    if event.get("ready") or event.get("failed"):
                        return
                    continue
                getter.cancel()
                while not queue.empty():
                    yield queue.get_nowait()
                return
        finally:
            fetch.cancel()

    async def projects(self, user: str) -> list[str]:
        """The names of ``user``'s own projects (named servers), sorted; [] for none."""
        url = f"{self.api}/users/{_q(user)}?include_stopped_servers=1"
        code, data = await self._json("GET", url)
        if code == 404:
            return []
        if code != 200 or not isinstance(data, dict):
            raise HubError(f"GET /users/<user> answered {code}")
        servers = data.get("servers")
        return (
            sorted(n for n in servers if isinstance(n, str) and n)
            if isinstance(servers, dict)
            else []
        )

    async def activity(self, owner: str, project: str, when: float) -> None:
        """Mark ``owner``'s ``project`` active at ``when`` (epoch seconds): its server's
        last_activity, which the idle culler and the GPU keeper read."""
        from datetime import UTC, datetime

        iso = datetime.fromtimestamp(when, UTC).isoformat().replace("+00:00", "Z")
        body = {"servers": {project: {"last_activity": iso}}}
        code, _ = await self._json("POST", f"{self.api}/users/{_q(owner)}/activity", body=body)
        if code not in (200, 204):
            raise HubError(f"POST /users/<owner>/activity answered {code}")

    async def session_env(self, owner: str, project: str, user: str) -> dict | None:
        """The secrets answer for ``user``'s sessions in ``owner``'s ``project``; None
        where the hub has none (no secrets API, or nothing for them)."""
        query = urlencode({"for": user})
        url = f"{self.api}/gpulab/secrets/{_q(owner)}/{_q(project)}?{query}"
        code, data = await self._json("GET", url)
        if code == 200 and isinstance(data, dict):
            return data
        if code in (403, 404):
            return None
        raise HubError(f"secrets API answered {code}")

    def close(self) -> None:
        self._http.close()
