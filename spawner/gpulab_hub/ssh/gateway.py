"""gpulab's SSH gateway: ``ssh <user>+<project>@<hub> -p <port>`` lands in a shell in
that project's container (asyncssh server; sessions.py bridges each channel).

Login: the name is parsed whole (names.parse_login); a malformed one fails like a
wrong key. A bare account name (``ssh alice@host``, no project) is let in by that
account's own key or token only to be told what to type and the names of the account's
own projects (:class:`choose.ChooseProject`); every session and forward of such a connection
ends there. Anyone else gets the same refusal as a wrong key, with the login forms in
the banner, and no project names.

Keys are the user's own, kept on the hub (keys.KeyStore); a password is a
hub API token of that user that may manage their projects (never a project server's
own token, which everyone who runs code in a container can read). No
keyboard-interactive, agent, X11 or remote (-R) forwarding. Failed logins are limited
per account and per address (limits.py).

After login, each session or forward asks the hub (hubclient.py, ssh/hubapi.py) what
the user may do in the project: only its owner and collaborators get a process, as
the notebook user the hub names, in a container labelled as the project's. A stopped
project is started (its progress shown on stderr) where the user may start it. Open
connections are asked about again every ``recheck_s`` seconds and closed, with the
reason, once the user's access has gone; at the same time, while a session or forward
is open, the project is marked active in the hub (at most every
``ACTIVITY_EVERY_S``), so an open SSH session keeps the idle culler and the GPU keeper
from stopping it. Every event goes to the session log (audit.py).
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import Callable

import asyncssh

from gpulab_hub import blocking
from gpulab_hub.ssh import ACTIVITY_EVERY_S, checks, hostkey, sessions
from gpulab_hub.ssh.audit import Audit
from gpulab_hub.ssh.choose import ChooseProject
from gpulab_hub.ssh.dockerexec import Docker, ExecError
from gpulab_hub.ssh.hubclient import HubClient, HubError
from gpulab_hub.ssh.limits import Limiter, lockout_message
from gpulab_hub.ssh.names import Login, parse_account, parse_login
from gpulab_hub.ssh.peer import Ready
from gpulab_hub.ssh.sessions import Refused
from gpulab_hub.ssh.settings import Settings

LOGIN_TIMEOUT_S = 30
START_TIMEOUT_S = 3600  # a project's first start may build its image
RECHECK_FAILURES = 3  # hub answers missed in a row before open connections are closed
MAX_LOGGING_IN = 10  # connections of one address not logged in yet, at once (sshd's too)
TOKEN = re.compile(r"[A-Za-z0-9_-]{16,256}")  # what a hub API token looks like
LOGIN_HELP = (
    "gpulab: log in as <you>+<project> (your own project) or <you>+<owner>~<project> "
    "(one shared with you), e.g. ssh -p <port> alice+one@<host>\r\n"
)


def token_may_log_in(model: dict | None, user: str) -> bool:
    """Whether the hub's model of a token (``GET /user``) lets ``user`` log in with it:
    the token is that user's and may manage their projects (a token made on the hub's
    token page may; a project server's own token and OAuth tokens may not)."""
    if not isinstance(model, dict) or model.get("kind", "user") != "user":
        return False
    if model.get("name") != user:
        return False
    scopes = model.get("scopes")
    return isinstance(scopes, list) and ("servers" in scopes or f"servers!user={user}" in scopes)


class Gateway:
    """What every connection shares: settings, hub and Docker clients, limits, log."""

    def __init__(self, settings: Settings, docker: Docker, hub: HubClient, audit: Audit):
        from gpulab_hub.ssh.keys import KeyStore

        self.settings = settings
        self.docker = docker
        self.hub = hub
        self.audit = audit
        self.limiter = Limiter(settings.limits)
        self.keys = KeyStore(settings.keys_dir)
        self.connections: set[Connection] = set()
        self.logging_in: dict[str, int] = {}  # address -> its connections not logged in
        self._ids = itertools.count(1)
        self.server: asyncssh.SSHAcceptor | None = None

    def next_id(self) -> int:
        return next(self._ids)

    async def user_keys(self, user: str) -> list:
        return await blocking.run(blocking.RECORDS, self.keys.login_keys, user)

    async def start(self, host_key: asyncssh.SSHKey) -> None:
        s = self.settings
        self.server = await asyncssh.create_server(
            lambda: Connection(self),
            s.bind,
            s.port,
            server_host_keys=[host_key],
            server_version="gpulab",
            encoding=None,
            public_key_auth=True,
            password_auth=True,
            kbdint_auth=False,
            host_based_auth=False,
            gss_host=None,
            allow_pty=True,
            line_editor=False,
            agent_forwarding=False,
            x11_forwarding=False,
            login_timeout=LOGIN_TIMEOUT_S,
            keepalive_interval=60,
            keepalive_count_max=3,
            reuse_address=True,
        )

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        for conn in list(self.connections):
            conn.close("gpulab's SSH gateway is stopping; connect again in a moment.", 0)


class Connection(asyncssh.SSHServer):
    """One client's SSH connection: its login, access and open sessions."""

    def __init__(self, gw: Gateway):
        self.gw = gw
        self.id = gw.next_id()
        self.ip = ""
        self.conn: asyncssh.SSHServerConnection | None = None
        self.login: Login | None = None
        self.account: str | None = None  # a bare account name: told what to type
        self.helped = False  # the login forms were sent in the banner
        self.locked = False
        self.tried = False
        self.password_counted = False
        self.key_ok = ""
        self.password_ok = False
        self.authed = False
        self.opened_at = time.monotonic()
        self.sessions: set = set()
        self._ready: Ready | None = None
        self._ready_lock = asyncio.Lock()
        self._watch: asyncio.Task | None = None
        self._env: dict[str, str] | None = None
        self._sessions = itertools.count(1)
        self._active_at = float("-inf")  # when the project was last marked active

    def next_session(self) -> str:
        return f"{self.id}.{next(self._sessions)}"

    # --- the log -------------------------------------------------------------------
    def audit(self, event: str, **fields) -> None:
        login = self.login
        who = {"user": login.user, "owner": login.owner, "project": login.project} if login else {}
        if login is None and self.account:
            who = {"user": self.account}
        self.gw.audit.event(event, conn=self.id, ip=self.ip, **who, **fields)

    # --- connection ----------------------------------------------------------------
    def connection_made(self, conn) -> None:
        self.conn = conn
        peer = conn.get_extra_info("peername") or ("", 0)
        self.ip = str(peer[0])
        self.gw.connections.add(self)
        self.gw.audit.event("connect", conn=self.id, ip=self.ip, port=peer[1])
        waiting = self.gw.logging_in.get(self.ip, 0) + 1
        self.gw.logging_in[self.ip] = waiting
        if waiting > MAX_LOGGING_IN:
            self.audit("refused", kind="connection", why="too many logins at once")
            asyncio.get_running_loop().call_soon(conn.close)

    def _logged_in_or_gone(self) -> None:
        left = self.gw.logging_in.get(self.ip, 0) - 1
        if left > 0:
            self.gw.logging_in[self.ip] = left
        else:
            self.gw.logging_in.pop(self.ip, None)

    def connection_lost(self, exc) -> None:
        self.gw.connections.discard(self)
        if not self.authed:
            self._logged_in_or_gone()
        if self._watch is not None:
            self._watch.cancel()
        if not self.authed and self.tried and not self.password_counted:
            self.gw.limiter.login_failed(self.ip)
        self.audit(
            "disconnect",
            duration_s=round(time.monotonic() - self.opened_at, 3),
            authenticated=self.authed,
        )

    def close(self, message: str, linger_s: float = 1.0) -> None:
        """Close every session (saying ``message`` on each), then, ``linger_s`` later
        (their last words on their way), the connection."""
        for session in list(self.sessions):
            session.close_because(message)
        if self.conn is None:
            return
        conn, reason = self.conn, message.removeprefix("gpulab: ")

        def disconnect() -> None:
            if self in self.gw.connections:  # not gone already
                conn.disconnect(asyncssh.DISC_BY_APPLICATION, reason)

        if linger_s <= 0:
            disconnect()
        else:
            asyncio.get_running_loop().call_later(linger_s, disconnect)

    # --- login ----------------------------------------------------------------------
    def begin_auth(self, username: str) -> bool:
        self.login = parse_login(username)
        self.account = parse_account(username) if self.login is None else None
        left = self.gw.limiter.address_locked(self.ip)
        if left:
            self.locked = True
            self._banner(lockout_message(left) + "\r\n")
        elif self.login is None and self.account is None:
            self._help()
        return True

    def _help(self) -> None:
        """The login forms, once, in the banner (shown before "Permission denied")."""
        if not self.helped:
            self.helped = True
            self._banner(LOGIN_HELP)

    @property
    def user(self) -> str | None:
        """The account this connection tries to log in as (None: a malformed name)."""
        return self.login.user if self.login is not None else self.account

    def _banner(self, text: str) -> None:
        if self.conn is not None:
            try:
                self.conn.send_auth_banner(text)
            except OSError:
                return

    def public_key_auth_supported(self) -> bool:
        return True

    def password_auth_supported(self) -> bool:
        return True

    def kbdint_auth_supported(self) -> bool:
        return False

    async def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        self.tried = True
        if self.locked or self.user is None:
            return False
        fingerprint = key.get_fingerprint("sha256")
        for stored in await self.gw.user_keys(self.user):
            if stored.fingerprint != fingerprint:
                continue
            try:
                same = asyncssh.import_public_key(stored.openssh).public_data == key.public_data
            except (asyncssh.KeyImportError, ValueError):
                same = False
            if same:
                self.key_ok = fingerprint
                return True
        self.audit("auth", ok=False, method="publickey", fingerprint=fingerprint)
        if self.account is not None:
            self._help()
        return False

    async def validate_password(self, username: str, password: str) -> bool:
        self.tried = True
        user = self.user
        if self.locked or user is None:
            self._password_failed(None)
            return False
        if self.account is not None:
            self._help()
        left = self.gw.limiter.password_locked(self.ip, user)
        if left:
            self._banner(lockout_message(left) + "\r\n")
            self.audit("auth", ok=False, method="password", reason="locked")
            return False
        model = None
        if isinstance(password, str) and TOKEN.fullmatch(password):
            try:
                model = await self.gw.hub.whoami(password)
            except HubError as e:
                self.audit("auth", ok=False, method="password", reason=f"hub: {e}")
                self._banner("gpulab: the hub does not answer, so tokens cannot be checked; "
                             "try again in a minute.\r\n")  # fmt: skip
                return False
        if not token_may_log_in(model, user):
            self._password_failed(user)
            left = self.gw.limiter.password_locked(self.ip, user)
            if left:
                self._banner(lockout_message(left) + "\r\n")
            return False
        self.gw.limiter.password_succeeded(user)
        self.password_ok = True
        return True

    def _password_failed(self, user: str | None) -> None:
        self.password_counted = True
        self.gw.limiter.password_failed(self.ip, user)
        self.audit("auth", ok=False, method="password")

    def auth_completed(self) -> None:
        self.authed = True
        self._logged_in_or_gone()
        if self.password_ok:
            self.audit("auth", ok=True, method="password")
        else:
            self.audit("auth", ok=True, method="publickey", fingerprint=self.key_ok)

    # --- what the user may do ---------------------------------------------------------
    async def ready(self, say: Callable[[str], None] | None) -> Ready:
        """Where this connection's sessions run, the project started first if it is not
        running (progress through ``say``; forwards, with none, are refused instead).
        Refused says why not."""
        async with self._ready_lock:
            if self._ready is not None:
                return self._ready
            login = self.login
            assert login is not None
            for _ in range(3):
                try:
                    answer = await self.gw.hub.access(login.user, login.owner, login.project)
                except HubError as e:
                    self.audit("hub-error", error=str(e))
                    raise Refused("gpulab: the hub does not answer; try again in a minute.") from e
                decision = checks.decide(answer, login.owner, login.project)
                if decision.action == "go":
                    if answer.get("prefix", self.gw.settings.prefix) != self.gw.settings.prefix:
                        raise Refused("gpulab: the hub's answer is for another gpulab.")
                    try:
                        container_id = await self.gw.docker.verify(
                            decision.container, self.gw.settings.prefix, login.owner, login.project
                        )
                    except ExecError as e:
                        raise Refused(str(e)) from e
                    self._ready = Ready(
                        container_id, decision.exec_user, decision.workdir, answer["role"]
                    )
                    if self._watch is None:
                        self._watch = asyncio.ensure_future(self._recheck())
                    return self._ready
                if decision.action == "refuse":
                    raise Refused(decision.message)
                if answer.get("pending") == "stop":
                    raise Refused(
                        f"gpulab: project {login.project} is stopping; try again once it has "
                        "stopped (a few seconds)."
                    )
                if say is None:
                    raise Refused(
                        f"gpulab: project {login.project} is not running. Start it first: "
                        "open a shell (ssh without -N) or start it on gpulab's home page."
                    )
                await self._start(say, decision.action == "start")
            raise Refused(f"gpulab: project {login.project} did not become ready; try again.")

    def forget_ready(self) -> None:
        self._ready = None

    async def _start(self, say: Callable[[str], None], start: bool) -> None:
        """Start the project (``start``) or wait for its start under way, saying each of
        its progress messages as it comes."""
        login = self.login
        assert login is not None
        project = login.project
        say(f"gpulab: starting project {project} …")
        post = asyncio.ensure_future(self.gw.hub.start(login.owner, project)) if start else None
        last = ""
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                # JupyterHub follows a start only once it is under way: ask, and again
                # while the request to start it is still being answered.
                await asyncio.sleep(0.3)
                async for event in self.gw.hub.progress(login.owner, project, START_TIMEOUT_S):
                    text = checks.plain_text(event.get("message"), 300)
                    if event.get("failed"):
                        raise Refused(
                            f"gpulab: project {project} did not start: "
                            f"{text or 'no reason given'}. Its build log and what to do are on "
                            "gpulab's home page."
                        )
                    if text and text != last:
                        last = text
                        say(f"gpulab: starting project {project} … {text}")
                    if event.get("ready"):
                        say(f"gpulab: project {project} is running.")
                        return
                if post is None or post.done():
                    break
            if post is not None:
                code, message = await post
                self.audit("start", code=code)
                if code not in (201, 202, 400):
                    why = checks.plain_text(message, 300) or f"the hub answered {code}"
                    raise Refused(f"gpulab: project {project} could not start: {why}")
                if code == 201:  # it was ready before its progress could be followed
                    say(f"gpulab: project {project} is running.")
        finally:
            if post is not None and not post.done():
                post.cancel()

    async def session_env(self) -> dict[str, str]:
        """The user's secrets for this project's sessions (none where the hub has none)."""
        if self._env is None:
            login = self.login
            assert login is not None
            try:
                answer = await self.gw.hub.session_env(login.owner, login.project, login.user)
            except HubError as e:
                raise Refused(
                    "gpulab: the hub did not give this session its environment; try again."
                ) from e
            self._env = checks.secrets_env(answer)
        return self._env

    async def _recheck(self) -> None:
        """Ask the hub again every recheck_s; close the connection once access has gone."""
        login = self.login
        assert login is not None
        missed = 0
        while True:
            await asyncio.sleep(self.gw.settings.recheck_s)
            try:
                answer = await self.gw.hub.access(login.user, login.owner, login.project)
            except HubError as e:
                missed += 1
                self.audit("hub-error", error=str(e))
                if missed >= RECHECK_FAILURES:
                    self._revoke("gpulab: the hub has not answered for a while, so this "
                                 "connection is closed; connect again later.")  # fmt: skip
                    return
                continue
            missed = 0
            if answer.get("role") not in checks.RUN_ROLES:
                decision = checks.decide(answer, login.owner, login.project)
                self._revoke(f"{decision.message} This connection is closed.")
                return
            if not answer.get("running"):
                self._ready = None  # stopped: a new session starts it again
            else:
                await self.mark_active()

    async def mark_active(self) -> None:
        """While a session or forward is open, mark the project active in the hub (at
        most every ACTIVITY_EVERY_S); a failure is logged, never fatal."""
        login = self.login
        now = time.time()
        if login is None or not self.sessions or now - self._active_at < ACTIVITY_EVERY_S:
            return
        try:
            await self.gw.hub.activity(login.owner, login.project, now)
        except HubError as e:
            self.audit("hub-error", error=str(e))
            return
        self._active_at = now

    def _revoke(self, message: str) -> None:
        self.audit("revoked", why=message, sessions=len(self.sessions))
        self.close(message)

    # --- sessions and forwards ----------------------------------------------------------
    def session_started(self, session) -> None:
        self.sessions.add(session)

    def session_ended(self, session) -> None:
        self.sessions.discard(session)

    def session_requested(self):
        if self.login is None:
            return ChooseProject(self)  # choose.py
        return sessions.ProjectSession(self)

    def _no_project(self) -> asyncssh.ChannelOpenError:
        self.audit("refused", kind="forward", why="no project named")
        return asyncssh.ChannelOpenError(
            asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED,
            f"gpulab: name the project to forward to: {self.user}+<project> or "
            f"{self.user}+<owner>~<project> as the login name.",
        )

    def connection_requested(self, dest_host, dest_port, orig_host, orig_port):
        if self.login is None:
            raise self._no_project()
        target = checks.forward_target(dest_host, dest_port)
        fields = {"port": dest_port if isinstance(dest_port, int) else None}
        if target is None:
            shown = checks.plain_text(str(dest_host), 80)
            self.audit("refused", kind="forward", host=shown, **fields)
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED,
                "gpulab forwards only to ports of the project itself (localhost:<port>), "
                f"not to {shown}.",
            )
        address, port = target
        return sessions.open_forward(
            self, ("tcp", address, str(port)), {"port": port}, sessions.TCPForward
        )

    def unix_connection_requested(self, dest_path):
        if self.login is None:
            raise self._no_project()
        path = checks.socket_path(dest_path)
        if path is None:
            self.audit("refused", kind="forward", socket=checks.plain_text(str(dest_path), 120))
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED,
                "gpulab forwards only to plain absolute socket paths in the project.",
            )
        return sessions.open_forward(self, ("unix", path), {"socket": path}, sessions.UNIXForward)

    def server_requested(self, listen_host, listen_port):
        self.audit("refused", kind="remote-forward")
        return False

    def unix_server_requested(self, listen_path):
        self.audit("refused", kind="remote-forward")
        return False


async def serve(settings: Settings, stop: asyncio.Event, make_docker_client) -> None:
    """Run the gateway until ``stop`` is set."""
    import sys

    key = hostkey.load_or_make(settings.host_key)
    audit = Audit(settings.log or None, sys.stderr)
    docker = Docker(make_docker_client)
    hub = HubClient(settings.api_url, settings.api_token)
    gw = Gateway(settings, docker, hub, audit)
    await gw.start(key)
    audit.event(
        "listening", bind=settings.bind, port=settings.port, host_key=hostkey.fingerprint(key)
    )
    try:
        await stop.wait()
    finally:
        await gw.stop()
        hub.close()
        docker.close()
        audit.event("stopped")
        audit.close()
