"""Open websocket connections (kernels, terminals, collaboration rooms) lose their
access when their person does.

A websocket is authorized once, when it opens; a share revoked or lowered after
that would otherwise leave it working for as long as it stays open. The project
server's authorizer (authorizer.py) hands each websocket it allowed to
:class:`OpenConnections`, with what it was allowed. Every ``interval`` seconds,
while any is open, each connection's token is asked of the hub again (bypassing
the token cache) and what it was allowed is checked again against a fresh list of
the server's shares; a connection whose person lost any of it is closed with
:data:`CLOSE_CODE`. A revoked token, a revoked or lowered share, and a group share
its person left all end the connection within ``interval`` plus one hub request.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable

# The websocket close code sent to a connection whose access ended (4000-4999: for
# applications; 4403 reads as HTTP's 403).
CLOSE_CODE = 4403
CLOSE_REASON = "access to this project was revoked or lowered"

# check(token, allowed) -> whether the person behind ``token`` may still do everything
# in ``allowed`` (a set of (action, resource)) through ``handler``.
Check = Callable[[object, str, frozenset], Awaitable[bool]]


def is_open(handler) -> bool:
    """Whether a tornado WebSocketHandler's connection is open now."""
    connection = getattr(handler, "ws_connection", None)
    return connection is not None and not connection.is_closing()


class OpenConnections:
    """The websockets a server's authorizer let open, re-checked while they stay open."""

    def __init__(self, check: Check, interval: float, log):
        self.check = check
        self.interval = interval
        self.log = log
        # handler -> (token, what it was allowed); gone with the handler
        self._open: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._task: asyncio.Task | None = None

    def __len__(self) -> int:
        return len(self._open)

    def watch(self, handler, token: str, action: str, resource: str) -> None:
        """Remember that ``handler`` (a websocket, maybe not yet open) was allowed
        ``action`` on ``resource`` with ``token``."""
        if not token or self.interval <= 0:
            return
        _, allowed = self._open.get(handler, (token, frozenset()))
        self._open[handler] = (token, allowed | {(action, resource)})
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while len(self._open):
            await asyncio.sleep(self.interval)
            try:
                await self.recheck()
            except asyncio.CancelledError:
                raise
            except Exception:  # a failed round must not end the re-checks
                self.log.exception("gpulab: re-checking open connections failed")

    async def recheck(self) -> int:
        """Check every open connection once; close those no longer allowed. How many
        were closed."""
        closed = 0
        verdicts: dict[tuple[str, frozenset], bool] = {}
        for handler, (token, allowed) in list(self._open.items()):
            if not is_open(handler):  # not open yet, or closed (then soon collected)
                continue
            key = (token, allowed)
            if key not in verdicts:
                verdicts[key] = await self.check(handler, token, allowed)
            if verdicts[key] or not is_open(handler):
                continue
            user = getattr(handler.current_user, "username", "?")
            self.log.warning(
                "gpulab: closing %s's %s: %s", user, type(handler).__name__, CLOSE_REASON
            )
            self._open.pop(handler, None)
            handler.close(CLOSE_CODE, CLOSE_REASON)
            closed += 1
        return closed
