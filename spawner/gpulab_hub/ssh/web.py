"""The hub page /hub/gpulab/ssh: each user's SSH keys, and how to connect.

Any logged-in user: their public keys (type, comment, fingerprint, when added), a form
to add one and a Delete per key (POST forms with JupyterHub's XSRF check; the keys
live in keys.KeyStore). Below, "How to connect": the exact ``ssh`` command of each of
the user's own projects and of each project shared with them as collaborator (directly
or through a group); projects they only view are listed as such (viewers get no
shell). The gateway's host key fingerprint, for checking on the first connection, is
read from the public half the gateway wrote beside its key. With GPULAB_SSH_PORT=0 the
page says SSH is off on this gpulab (keys can still be kept).
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from jupyterhub.handlers import BaseHandler
from tornado import web

from gpulab_hub import blocking
from gpulab_hub.projects.title import title
from gpulab_hub.settingvalues import valid_host
from gpulab_hub.sharing import roles
from gpulab_hub.ssh import names
from gpulab_hub.ssh.keys import KeyRefused, KeyStore, StoredKey

FINGERPRINT = re.compile(r"SHA256:[A-Za-z0-9+/]{43}")
MAX_HOST_KEY = 4096
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class Connect:
    """One project the user may (or, as a viewer, may not) open a shell in."""

    owner: str
    project: str
    role: str  # "owner", "collaborator", "viewer"
    login: str  # "" where no login name can name it
    command: str
    title: str = ""  # the project as people know it (projects/title.py)


@dataclass(frozen=True)
class HostKey:
    algorithm: str
    fingerprint: str
    openssh: str


def ssh_host(public_url: str, request_host: str) -> str:
    """The host people type after ``@``: GPULAB_PUBLIC_URL's, else the one this page
    was asked on (without its port); "" when neither is a plain host name or address."""
    host = urlsplit(public_url).hostname if public_url else None
    if not host:
        try:
            host = urlsplit("//" + request_host).hostname
        except ValueError:
            host = None
    return host if host and valid_host(host) else ""


def command(port: int, login: str, host: str) -> str:
    return f"ssh -p {port} {login}@{host or '<gpulab host>'}"


def read_host_key(path: Path) -> HostKey | None:
    """Blocking: the gateway's public host key (``<key>.pub``), None until it wrote one."""
    import asyncssh

    pub = Path(str(path) + ".pub")
    try:
        fd = os.open(pub, _FILE_FLAGS)
    except OSError as e:
        if e.errno not in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
            raise
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, MAX_HOST_KEY + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_HOST_KEY:
        return None
    try:
        key = asyncssh.import_public_key(data)
    except (asyncssh.KeyImportError, ValueError):
        return None
    key.set_comment(None)
    algorithm = key.get_algorithm()
    return HostKey(
        algorithm=algorithm.decode() if isinstance(algorithm, bytes) else str(algorithm),
        fingerprint=key.get_fingerprint("sha256"),
        openssh=key.export_public_key("openssh").decode("ascii").strip(),
    )


def iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


class SSHPageHandler(BaseHandler):
    """GET: the page; POST ``action=add`` (``key``) or ``action=delete`` (``fingerprint``)."""

    def initialize(self, keys_dir: str, host_key: str, port: int, public_url: str = ""):
        self.store = KeyStore(keys_dir, log=self.log)
        self.host_key = Path(host_key)
        self.port = port
        self.given_public_url = public_url

    def _row(self, spawner, role: str, host: str) -> Connect:
        owner, project = spawner.user.name, spawner.name
        me = self.current_user.name
        login = names.login_name(me, owner, project)
        if names.parse_login(login) != names.Login(me, owner, project):
            login = ""  # e.g. an owner whose name holds "+" (names.py)
        return Connect(owner, project, role, login, command(self.port, login, host), title(spawner))

    def _connect_rows(self) -> list[Connect]:
        """The user's own projects, then the projects shared with them (one row each,
        with the role of their own share and their groups' together)."""
        me = self.current_user.orm_user
        host = ssh_host(self.given_public_url, self.request.host)
        mine = me.orm_spawners
        rows = [self._row(mine[p], "owner", host) for p in sorted(mine) if p]
        shared = {}
        for share in me.all_shared_with_me:
            if share.owner is not None and share.spawner is not None:
                shared[(share.owner.name, share.spawner.name)] = share.spawner
        for _where, spawner in sorted(shared.items()):
            role = roles.role_on(self.db, me, spawner)
            if role in ("collaborator", "viewer"):
                rows.append(self._row(spawner, role, host))
        return rows

    async def _page(self, status: int = 200, message: str = "", error: str = ""):
        user = self.current_user.name
        keys: list[StoredKey] = await blocking.run(blocking.RECORDS, self.store.keys, user)
        host_key = None
        if self.port:
            host_key = await blocking.run(blocking.RECORDS, read_host_key, self.host_key)
        rows = self._connect_rows() if self.port else []
        html = await self.render_template(
            "gpulab-ssh.html",
            keys=[(k, iso(k.added)) for k in keys],
            port=self.port,
            host=ssh_host(self.given_public_url, self.request.host),
            own=[r for r in rows if r.role == "owner"],
            shared=[r for r in rows if r.role == "collaborator"],
            viewed=[r for r in rows if r.role == "viewer"],
            host_key=host_key,
            token_url=f"{self.hub.base_url}token",
            message=message,
            error=error,
        )
        self.set_status(status)
        self.finish(html)

    @web.authenticated
    async def get(self):
        await self._page()

    @web.authenticated
    async def post(self):
        user = self.current_user.name
        action = self.get_body_argument("action", "")
        if action == "add":
            text = self.get_body_argument("key", "", strip=False)
            try:
                key = await blocking.run(blocking.RECORDS, self.store.add, user, text)
            except KeyRefused as e:
                await self._page(400, error=str(e))
                return
            said = f" ({key.comment})" if key.comment else ""
            await self._page(message=f"Added your {key.algorithm} key{said}: {key.fingerprint}.")
            return
        if action == "delete":
            fingerprint = self.get_body_argument("fingerprint", "")
            if not FINGERPRINT.fullmatch(fingerprint):
                await self._page(400, error="Choose a key to delete from the list.")
                return
            if not await blocking.run(blocking.RECORDS, self.store.remove, user, fingerprint):
                await self._page(404, error=f"You have no key {fingerprint} (deleted already?).")
                return
            await self._page(message=f"Deleted the key {fingerprint}: it no longer opens a shell.")
            return
        await self._page(400, error="Unknown action: use the page's buttons.")
