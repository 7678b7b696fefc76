"""A process in a project's container for an SSH channel, through Docker's exec API.

Each shell, command, sftp session and forwarded connection is one ``docker exec`` (the
Docker SDK's ``exec_create`` / ``exec_start(socket=True)``) as the notebook user the
hub names, in the project's folder, with a pseudo-terminal only when the client asked
for one. The gateway never connects to a container's address: a forward runs a tiny
relay (:data:`RELAY`) in the container that connects to the container's own loopback
or Unix socket. Blocking SDK calls run on the gateway's Docker threads, never on the
event loop; the exec's connection itself is read and written with asyncio.

Before each exec the container is checked to be the project's: running, and labelled
with this gpulab instance, the owner and the project (:meth:`Docker.verify`).
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import docker.errors
import requests.exceptions

from gpulab_hub import blocking

STDOUT, STDERR = 1, 2
SFTP_SERVER = "/usr/lib/openssh/sftp-server"
PYTHON = "/opt/gpulab/venv/bin/python3"  # every project image has it (the base image's)
READ_SIZE = 64 * 1024

# Runs in the container as the notebook user: connects to ("tcp", host, port) or
# ("unix", path), says "+" on stderr once connected (or "-why" and exits 1), then
# copies stdin to the socket (half-closing it at EOF) and the socket to stdout.
RELAY = r"""
import os, socket, sys, threading
kind, where = sys.argv[1], sys.argv[2:]
try:
    if kind == "unix":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect(where[0])
    else:
        s = socket.create_connection((where[0], int(where[1])), timeout=10)
    s.settimeout(None)
except OSError as e:
    os.write(2, ("-" + (e.strerror or type(e).__name__)).encode()[:200])
    sys.exit(1)
os.write(2, b"+")
def up():
    while True:
        data = os.read(0, 65536)
        if not data:
            break
        s.sendall(data)
    try:
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass
threading.Thread(target=up, daemon=True).start()
while True:
    data = s.recv(65536)
    if not data:
        break
    while data:
        data = data[os.write(1, data):]
"""

# Ends a terminal session whose client went (Docker keeps a terminal's process running
# when its connection closes): SIGHUP to the session leader among the notebook user's
# processes that carry the session's mark, as a closed terminal does under sshd (bash
# passes it on to its jobs; nohup'd ones go on).
HANGUP = r"""
import os, signal, sys
mark = ("GPULAB_SSH_SESSION=" + sys.argv[1]).encode()
for name in os.listdir("/proc"):
    if not name.isdigit():
        continue
    pid = int(name)
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            if mark not in f.read().split(b"\0"):
                continue
        with open("/proc/%d/stat" % pid, "rb") as f:
            session = int(f.read().rsplit(b")", 1)[1].split()[3])
        if session == pid:
            os.kill(pid, signal.SIGHUP)
    except (OSError, ValueError, IndexError):
        pass
"""
MARK = "GPULAB_SSH_SESSION"

# The sftp subsystem: Debian's sftp-server (openssh-sftp-server, in gpulab's base image).
SFTP_SCRIPT = (
    f"if [ -x {SFTP_SERVER} ]; then exec {SFTP_SERVER}; fi; "
    "echo 'gpulab: this project has no SFTP server, so sftp and scp cannot copy files. "
    "Restart the project to rebuild it on the current base image, or add "
    '"openssh-sftp-server" to its Dockerfile.\' >&2; exit 127'
)


def shell_command() -> list[str]:
    return ["/bin/bash", "-l"]


def exec_command(command: str) -> list[str]:
    return ["/bin/bash", "-lc", command]


def sftp_command() -> list[str]:
    return ["/bin/sh", "-c", SFTP_SCRIPT]


def relay_command(*target: str) -> list[str]:
    """The relay for ("tcp", host, port) or ("unix", path)."""
    return [PYTHON, "-I", "-S", "-c", RELAY, *target]


class ExecError(Exception):
    """The process could not be started; ``str()`` says why, for the user."""


class Demux:
    """Docker's multiplexed output of an exec without a terminal, taken apart as it
    arrives: frames of an 8-byte header (stream, 0, 0, 0, length as big-endian uint32)
    and that many bytes. Payload is passed on as it comes, never gathered whole."""

    def __init__(self):
        self._header = b""
        self._stream = 0
        self._left = 0

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        view = memoryview(data)
        while view:
            if self._left:
                piece = bytes(view[: self._left])
                view = view[len(piece) :]
                self._left -= len(piece)
                # stdin's number (0) is never sent; 3 is the engine's own error stream
                out.append((STDOUT if self._stream == STDOUT else STDERR, piece))
                continue
            need = 8 - len(self._header)
            self._header += bytes(view[:need])
            view = view[need:]
            if len(self._header) == 8:
                self._stream, self._left = struct.unpack(">BxxxL", self._header)
                self._header = b""
        return out

    @property
    def idle(self) -> bool:
        """No frame is half-read."""
        return not self._header and not self._left


@dataclass
class ExecSpec:
    cmd: list[str]
    user: str  # "uid:gid", from the hub
    workdir: str = "/workspace"
    env: dict[str, str] = field(default_factory=dict)
    tty: bool = False


class Docker:
    """The gateway's one Docker client; its blocking calls (and its making, which asks
    the engine's version) run on the gateway process's Docker pool (blocking.DOCKER,
    ``threads`` threads), never on its event loop."""

    def __init__(self, make_client: Callable[[], object], threads: int = 8):
        self._make_client = make_client
        self._client = None
        blocking.configure(blocking.DOCKER, threads)

    @property
    def client(self):
        if self._client is None:
            blocking.off_loop("Making the Docker client")
            self._client = self._make_client()
        return self._client

    def _call(self, method: str, *args, **kwargs):
        return getattr(self.client, method)(*args, **kwargs)

    async def call(self, method: str, *args, **kwargs):
        return await blocking.run(blocking.DOCKER, self._call, method, *args, **kwargs)

    async def verify(self, container: str, prefix: str, owner: str, project: str) -> str:
        """The Id of ``container`` if it is running and is ``owner``'s ``project`` of this
        gpulab instance (its labels); ExecError otherwise."""
        try:
            info = await self.call("inspect_container", container)
        except docker.errors.NotFound:
            raise ExecError(
                f"gpulab: project {project} has no running container (it may have just "
                "stopped); try again."
            ) from None
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            why = type(e).__name__
            raise ExecError(f"gpulab: the Docker engine did not answer ({why}).") from e
        labels = (info.get("Config") or {}).get("Labels") or {}
        mine = (
            labels.get("gpulab.instance") == prefix
            and labels.get("gpulab.owner") == owner
            and labels.get("gpulab.project") == project
        )
        if not mine:
            raise ExecError(f"gpulab: the container the hub named is not project {project}'s.")
        if not (info.get("State") or {}).get("Running"):
            raise ExecError(f"gpulab: project {project} is not running any more; start it again.")
        return info["Id"]

    async def hangup(self, container_id: str, user: str, mark: str) -> None:
        """SIGHUP to the terminal session marked ``mark`` (see HANGUP), as ``user``."""
        try:
            created = await self.call(
                "exec_create",
                container_id,
                [PYTHON, "-I", "-S", "-c", HANGUP, mark],
                stdout=False,
                stderr=False,
                user=user,
                privileged=False,
            )
            await self.call("exec_start", created["Id"], detach=True)
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return  # the container has stopped: so has the session

    async def start(self, container_id: str, spec: ExecSpec) -> ExecStream:
        """Start ``spec`` in the container; its stream, stdin open."""
        try:
            created = await self.call(
                "exec_create",
                container_id,
                spec.cmd,
                stdout=True,
                stderr=True,
                stdin=True,
                tty=spec.tty,
                privileged=False,
                user=spec.user,
                environment=dict(spec.env),
                workdir=spec.workdir,
            )
            exec_id = created["Id"]
            sock = await self.call("exec_start", exec_id, tty=spec.tty, socket=True)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            explanation = getattr(e, "explanation", None) or type(e).__name__
            raise ExecError(f"gpulab: Docker could not start the process: {explanation}") from e
        conn, pending = _take_socket(sock)
        reader, writer = await asyncio.open_connection(sock=conn, limit=READ_SIZE)
        stream = ExecStream(self, exec_id, spec.tty, reader, writer, pending)
        stream.container_id, stream.user, stream.mark = container_id, spec.user, spec.env.get(MARK)
        return stream

    def close(self) -> None:
        blocking.shutdown()


def _take_socket(sock) -> tuple[socket.socket, bytes]:
    """The exec's connection as a socket of our own (a duplicate; docker-py's response
    is closed) and the bytes its HTTP reader had already buffered past the headers."""
    raw = sock._sock if isinstance(sock, socket.SocketIO) else sock
    response = getattr(sock, "_response", None)
    try:
        if type(raw) is not socket.socket:
            raise ExecError(
                "gpulab: the SSH gateway reaches containers only through a Docker engine on "
                "a Unix socket or plain TCP (not TLS); ask the administrator."
            )
        pending = b""
        reader = getattr(getattr(getattr(response, "raw", None), "_fp", None), "fp", None)
        if reader is not None:
            raw.setblocking(False)
            try:
                pending = reader.read1(READ_SIZE) or b""
            except (BlockingIOError, ValueError):
                pending = b""
        return raw.dup(), pending
    finally:
        if response is not None:
            response.close()
        sock.close()


class ExecStream:
    """One exec's connection: output as (stream, bytes), input, resize, exit code."""

    def __init__(self, dk: Docker, exec_id: str, tty: bool, reader, writer, pending: bytes):
        self.dk = dk
        self.exec_id = exec_id
        self.tty = tty
        self._reader: asyncio.StreamReader = reader
        self._writer: asyncio.StreamWriter = writer
        self._pending = pending
        self._demux = None if tty else Demux()
        self.container_id = ""
        self.user = ""
        self.mark: str | None = None
        self.exited = False

    def _split(self, data: bytes) -> list[tuple[int, bytes]]:
        return [(STDOUT, data)] if self._demux is None else self._demux.feed(data)

    async def output(self) -> AsyncIterator[tuple[int, bytes]]:
        """(STDOUT or STDERR, bytes) until the process's output ends."""
        if self._pending:
            data, self._pending = self._pending, b""
            for piece in self._split(data):
                yield piece
        while True:
            try:
                data = await self._reader.read(READ_SIZE)
            except (ConnectionError, OSError):
                return
            if not data:
                return
            for piece in self._split(data):
                yield piece

    async def write(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    def close_stdin(self) -> None:
        """End of input: the process reads EOF (the connection is half-closed)."""
        if not self._writer.is_closing() and self._writer.can_write_eof():
            try:
                self._writer.write_eof()
            except OSError:
                return

    async def resize(self, columns: int, rows: int) -> None:
        if not self.tty:
            return
        try:
            await self.dk.call("exec_resize", self.exec_id, height=rows, width=columns)
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return  # the process has ended, or the engine is busy: the next one may do

    async def exit_code(self, wait_s: float = 5.0) -> int | None:
        """The process's exit status once it has ended (None: unknown)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            try:
                info = await self.dk.call("exec_inspect", self.exec_id)
            except (docker.errors.DockerException, requests.exceptions.RequestException):
                return None
            if not info.get("Running") and info.get("ExitCode") is not None:
                self.exited = True
                return int(info["ExitCode"])
            if loop.time() >= deadline:
                return None
            await asyncio.sleep(0.1)

    def close(self) -> None:
        """Close the connection; a terminal session still running is hung up."""
        if not self._writer.is_closing():
            self._writer.close()
        if self.mark and not self.exited:
            self.exited = True
            asyncio.ensure_future(self.dk.hangup(self.container_id, self.user, self.mark))
