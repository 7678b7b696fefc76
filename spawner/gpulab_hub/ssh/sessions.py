"""SSH channels of the gateway, each bridged to one process in the project's container.

- :class:`ProjectSession`: a shell (``/bin/bash -l``, in a pseudo-terminal when the
  client asked for one), a command (``/bin/bash -lc <command>``, its exit status passed
  back) or the ``sftp`` subsystem (Debian's sftp-server: sftp, and scp from OpenSSH 9);
- :class:`TCPForward` / :class:`UNIXForward`: a ``-L`` forward (direct-tcpip) to a port
  on the container's own loopback, or a Unix socket in it (direct-streamlocal, what
  VS Code's Remote-SSH may use), through the relay of dockerexec.py.

Both directions are flow-controlled: the client is paused while the container has
not taken what it sent, and the container is not read while the client's window is
full. A session ends with the process's exit status; a client that goes away closes
the exec's connection (a pseudo-terminal's shell gets its hangup).
"""

from __future__ import annotations

import asyncio
import secrets
import time

import asyncssh

from gpulab_hub.ssh import checks, dockerexec
from gpulab_hub.ssh.dockerexec import STDOUT, ExecError, ExecSpec, ExecStream
from gpulab_hub.ssh.peer import Peer

HIGH_WATER = 256 * 1024  # bytes from the client waiting for the container: pause it
LOW_WATER = 64 * 1024
RELAY_CONNECT_S = 20


class Refused(Exception):
    """The user may not have this session or forward; ``str()`` tells them why."""


class _Input:
    """Bytes from the client on their way to the container, then its end."""

    def __init__(self):
        self._queue: asyncio.Queue = asyncio.Queue()
        self.size = 0

    def put(self, data: bytes) -> None:
        self.size += len(data)
        self._queue.put_nowait(data)

    def end(self) -> None:
        self._queue.put_nowait(None)

    async def get(self) -> bytes | None:
        data = await self._queue.get()
        if data is not None:
            self.size -= len(data)
        return data


class _Bridge:
    """What sessions and forwards share: input queue, flow control, byte counts."""

    kind = ""
    chan = None
    stream: ExecStream | None = None

    def _bridge_init(self, conn: Peer) -> None:
        self.conn = conn
        self.input = _Input()
        self.writable = asyncio.Event()
        self.writable.set()
        self.reading_paused = False
        self.bytes_in = 0
        self.bytes_out = 0
        self.started_at = time.monotonic()
        self.ended = False
        self.task: asyncio.Task | None = None
        self.sid = conn.next_session()  # the session's number in the log: "<conn>.<n>"
        self.fields: dict = {}

    # asyncssh session callbacks
    def data_received(self, data: bytes, datatype) -> None:
        self.bytes_in += len(data)
        self.input.put(data)
        if self.input.size > HIGH_WATER and not self.reading_paused and self.chan is not None:
            self.reading_paused = True
            self.chan.pause_reading()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    async def _pump_in(self, half_close: bool) -> None:
        """Client -> container, until the client's EOF."""
        while True:
            data = await self.input.get()
            if data is None:
                if half_close and self.stream is not None:
                    self.stream.close_stdin()
                return
            assert self.stream is not None
            await self.stream.write(data)
            if self.reading_paused and self.input.size < LOW_WATER and self.chan is not None:
                self.reading_paused = False
                self.chan.resume_reading()

    def _end(self, exit_status: int | None, reason: str = "") -> None:
        """The session is over: its log line (once), the exec's connection closed."""
        if self.ended:
            return
        self.ended = True
        if self.stream is not None:
            self.stream.close()
        self.conn.session_ended(self)
        self.conn.audit(
            "session-end",
            session=self.sid,
            kind=self.kind,
            **self.fields,
            duration_s=round(time.monotonic() - self.started_at, 3),
            exit_status=exit_status,
            bytes_in=self.bytes_in,
            bytes_out=self.bytes_out,
            reason=reason or None,
        )

    def close_because(self, message: str) -> None:
        """End it now (the user's access went): say why where the client shows it."""
        raise NotImplementedError


class ProjectSession(_Bridge, asyncssh.SSHServerSession):
    """A shell, a command or sftp in the project's container."""

    def __init__(self, conn: Peer):
        self._bridge_init(conn)
        self.tty = False
        self.term = checks.DEFAULT_TERM
        self.size: tuple[int, int] | None = None
        self.command = ""

    def connection_made(self, chan) -> None:
        self.chan = chan

    def pty_requested(self, term_type, term_size, term_modes) -> bool:
        self.tty = True
        self.term = checks.terminal_type(term_type)
        self.size = checks.window_size(term_size[0], term_size[1])
        return True

    def shell_requested(self) -> bool:
        self.kind = "shell"
        return True

    def exec_requested(self, command: str) -> bool:
        if not checks.command_ok(command):
            return False
        self.kind = "exec"
        self.command = command
        return True

    def subsystem_requested(self, subsystem: str) -> bool:
        if subsystem not in checks.SUBSYSTEMS:
            self.conn.audit("refused", kind="subsystem", subsystem=checks.plain_text(subsystem, 40))
            return False
        self.kind = subsystem
        return True

    def break_received(self, msec: int) -> bool:
        return False

    def session_started(self) -> None:
        self.task = asyncio.ensure_future(self._run())

    def eof_received(self) -> bool:
        self.input.end()
        return True  # keep sending the container's output

    def terminal_size_changed(self, width, height, pixwidth, pixheight) -> None:
        size = checks.window_size(width, height)
        if size is None:
            return
        self.size = size
        if self.stream is not None:
            asyncio.ensure_future(self.stream.resize(*size))

    def connection_lost(self, exc) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
        self._end(None, "the client closed the session")

    def say(self, line: str) -> None:
        """A line on the client's stderr."""
        if self.chan is None or self.ended:
            return
        end = "\r\n" if self.tty else "\n"
        self.chan.write_stderr((line.replace("\n", end) + end).encode("utf-8", "replace"))

    def close_because(self, message: str) -> None:
        self.say(message)
        if self.chan is not None and not self.ended:
            self.chan.exit(255)
        self._end(255, "access revoked")

    def _spec(self, ready, env: dict[str, str]) -> ExecSpec:
        if self.kind == "shell":
            cmd = dockerexec.shell_command()
        elif self.kind == "exec":
            cmd = dockerexec.exec_command(self.command)
        else:
            cmd = dockerexec.sftp_command()
        env = {**env, **checks.client_env(self.chan.get_environment())}
        if self.tty:
            env["TERM"] = self.term
            env[dockerexec.MARK] = secrets.token_hex(16)  # to hang it up (dockerexec.HANGUP)
        return ExecSpec(cmd, ready.exec_user, ready.workdir, env, self.tty)

    async def _run(self) -> None:
        try:
            ready = await self.conn.ready(self.say)
            env = await self.conn.session_env()
            spec = self._spec(ready, env)
            self.stream = await self.conn.gw.docker.start(ready.container_id, spec)
        except (Refused, ExecError, OSError) as e:
            if isinstance(e, OSError):  # the engine's connection broke as the process started
                e = ExecError(f"gpulab: the process could not be started ({e.strerror or e}).")
            if isinstance(e, ExecError):
                self.conn.forget_ready()  # the container may have gone: ask again next time
            self.say(str(e))
            self.conn.audit("refused", session=self.sid, kind=self.kind, why=str(e))
            if not self.ended:
                self.chan.exit(1)
            self._end(1, "refused")
            return
        self.fields = {"role": ready.role}
        if self.kind == "exec":
            self.fields["command_length"] = len(self.command)
        self.conn.session_started(self)
        self.conn.audit(
            "session-start", session=self.sid, kind=self.kind, tty=self.tty, **self.fields
        )
        if self.tty and self.size:
            await self.stream.resize(*self.size)
        # A pseudo-terminal's input has no end of its own (sshd does the same): the shell
        # ends at "exit" or when the client goes.
        pump = asyncio.ensure_future(self._pump_in(half_close=not self.tty))
        try:
            async for stream_no, data in self.stream.output():
                await self.writable.wait()
                if self.ended:
                    return
                self.bytes_out += len(data)
                if stream_no == STDOUT:
                    self.chan.write(data)
                else:
                    self.chan.write_stderr(data)
        finally:
            pump.cancel()
        status = await self.stream.exit_code()
        if self.ended:
            return
        if status is None:
            self.say("gpulab: the project's container went away (the project stopped).")
        self.chan.exit(255 if status is None else status)
        self._end(status)


class _Forward(_Bridge):
    """A forwarded connection to the relay in the container."""

    kind = "forward"

    def __init__(self, conn: Peer, stream: ExecStream, output, fields: dict):
        self._bridge_init(conn)
        self.stream = stream
        self._output = output
        self.fields = fields

    def connection_made(self, chan) -> None:
        self.chan = chan

    def session_started(self) -> None:
        self.conn.session_started(self)
        self.conn.audit("session-start", session=self.sid, kind=self.kind, **self.fields)
        self.task = asyncio.ensure_future(self._run())

    def eof_received(self) -> bool:
        self.input.end()
        return True

    def connection_lost(self, exc) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
        self._end(None)

    def close_because(self, message: str) -> None:
        if self.chan is not None and not self.ended:
            self.chan.close()
        self._end(None, "access revoked")

    async def _run(self) -> None:
        pump = asyncio.ensure_future(self._pump_in(half_close=True))
        try:
            async for stream_no, data in self._output:
                if stream_no != STDOUT:
                    continue  # the relay's own words
                await self.writable.wait()
                if self.ended:
                    return
                self.bytes_out += len(data)
                self.chan.write(data)
        finally:
            pump.cancel()
        if not self.ended:
            self.chan.write_eof()
            self.chan.close()
        self._end(None)


class TCPForward(_Forward, asyncssh.SSHTCPSession):
    pass


class UNIXForward(_Forward, asyncssh.SSHUNIXSession):
    pass


async def open_forward(conn: Peer, target: tuple[str, ...], fields: dict, cls):
    """Start the relay to ``target`` in the container; the forward's session once the
    relay has connected, else ChannelOpenError with the reason."""
    try:
        ready = await conn.ready(None)
        spec = ExecSpec(dockerexec.relay_command(*target), ready.exec_user, "/", {}, False)
        stream = await conn.gw.docker.start(ready.container_id, spec)
    except (Refused, ExecError, OSError) as e:
        if not isinstance(e, Refused):
            conn.forget_ready()
        conn.audit("refused", kind="forward", **fields, why=str(e))
        raise asyncssh.ChannelOpenError(asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, str(e)) from e
    output = stream.output()
    try:
        stream_no, first = await asyncio.wait_for(output.__anext__(), RELAY_CONNECT_S)
    except (TimeoutError, StopAsyncIteration):
        stream_no, first = 0, b"-no answer"
    if stream_no == STDOUT or not first.startswith(b"+"):
        stream.close()
        why = checks.plain_text(first[1:].decode("utf-8", "replace"), 200) or "no answer"
        where = fields.get("socket") or f"port {fields.get('port')}"
        conn.audit("refused", kind="forward", **fields, why=why)
        raise asyncssh.ChannelOpenError(
            asyncssh.OPEN_CONNECT_FAILED,
            f"gpulab: nothing answers on {where} in the project ({why})",
        )
    fields = {**fields, "role": ready.role}
    return cls(conn, stream, output, fields)
