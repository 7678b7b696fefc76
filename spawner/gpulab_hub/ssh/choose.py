"""The one session of an SSH login that names no project (``ssh alice@host``)."""

from __future__ import annotations

import asyncio

import asyncssh

from gpulab_hub.ssh.hubclient import HubError
from gpulab_hub.ssh.names import choose_project
from gpulab_hub.ssh.peer import Peer


class ChooseProject(asyncssh.SSHServerSession):
    """The one session of a login with no project (``ssh alice@host``): it says what
    to type and the account's own projects (names.choose_project), then exits 1."""

    def __init__(self, conn: Peer):
        self.conn = conn
        self.chan = None
        self.tty = False

    def connection_made(self, chan) -> None:
        self.chan = chan

    def pty_requested(self, term_type, term_size, term_modes) -> bool:
        self.tty = True
        return True

    def shell_requested(self) -> bool:
        return True

    def exec_requested(self, command: str) -> bool:
        return True

    def subsystem_requested(self, subsystem: str) -> bool:
        return True

    def eof_received(self) -> bool:
        return True  # the client's input ended (ssh < /dev/null): still say it

    def session_started(self) -> None:
        asyncio.ensure_future(self._tell())

    async def _tell(self) -> None:
        user = self.conn.account or ""
        try:
            projects = await self.conn.gw.hub.projects(user)
        except HubError as e:
            self.conn.audit("hub-error", error=str(e))
            projects = []
        text = choose_project(user, self.conn.gw.settings.port, projects)
        self.conn.audit("refused", kind="session", why="no project named")
        chan = self.chan
        if chan is None or chan.is_closing():
            return
        end = "\r\n" if self.tty else "\n"
        chan.write_stderr((text + end).encode("utf-8", "replace"))
        chan.exit(1)
