"""What an SSH channel (sessions.py, choose.py) asks of its login's connection.

gateway.py's ``Connection`` is the one implementation; the channels name these
protocols instead, so the gateway imports its channels and never the other way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from gpulab_hub.ssh.dockerexec import Docker
from gpulab_hub.ssh.hubclient import HubClient
from gpulab_hub.ssh.settings import Settings


@dataclass(frozen=True)
class Ready:
    """Where a session of this connection runs."""

    container_id: str
    exec_user: str
    workdir: str
    role: str


class GatewayParts(Protocol):
    """The gateway's clients a channel reaches through its connection."""

    settings: Settings
    docker: Docker
    hub: HubClient


class Peer(Protocol):
    """One login's connection, as its channels use it."""

    gw: GatewayParts
    account: str | None  # a bare account name (a login that named no project)

    def audit(self, event: str, **fields: Any) -> None: ...

    def next_session(self) -> str: ...

    async def ready(self, say: Callable[[str], None] | None) -> Ready: ...

    def forget_ready(self) -> None: ...

    async def session_env(self) -> dict[str, str]: ...

    def session_started(self, session: Any) -> None: ...

    def session_ended(self, session: Any) -> None: ...
