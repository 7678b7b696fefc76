"""gpulab's hub pages in-process, in JupyterHub's own testing style (docs/testing.md).

:func:`page_hub` builds JupyterHub's ``MockHub`` (jupyterhub.tests.mocking) from the
repository's own ``jupyterhub_config.py`` -- gpulab's real wiring: its authenticator,
its spawner class, its ``extra_handlers`` and templates -- with a real JupyterHub
database in a temporary folder, and serves the hub's tornado application on the hub's
own address (127.0.0.1, its hub_port). No proxy, no services, no Docker:
``MockHub.start`` is never called (it would start the proxy and the managed services),
and projects are never started. A test asks
a page as anonymous, a user or an admin (the signed login cookie JupyterHub's login page
would set) and reads the words a person would read.
"""

from __future__ import annotations

import asyncio
import html
import os
import re
import socket
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

from jupyterhub import orm
from jupyterhub.tests.mocking import MockHub
from jupyterhub.tests.utils import add_user
from tornado.httpclient import AsyncHTTPClient, HTTPResponse
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from tornado.web import create_signed_value
from traitlets.config.loader import PyFileConfigLoader

REPO = Path(__file__).resolve().parents[2]
ADMIN = "admin"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _environ(values: dict[str, str]):
    """The site variables ``values`` set for a while; the process's umask kept too (the
    hub's configuration sets the hub's own, 077, which would leak into later tests)."""
    saved = {k: os.environ.get(k) for k in values}
    umask = os.umask(0o022)
    os.umask(umask)
    os.environ.update(values)
    try:
        yield
    finally:
        os.umask(umask)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def site_env(home: Path, **extra: str) -> dict[str, str]:
    """The site settings of an in-process hub: its home in ``home``; the hub's address
    given (so nothing asks Docker for gpulab's network); no SSH gateway service."""
    env = {
        "GPULAB_HOME": str(home),
        "GPULAB_BIND_URL": f"http://127.0.0.1:{_port()}",
        "GPULAB_HUB_IP": "127.0.0.1",
        "GPULAB_HUB_PORT": str(_port()),
        "GPULAB_ADMIN": ADMIN,
        "GPULAB_ADMIN_PASSWORD": "an admin password of the fast lane",
        "GPULAB_CONTAINER_PREFIX": "gpulabfst",
        "GPULAB_SSH_PORT": "0",
    }
    env.update(extra)
    return env


def load_config(env: dict[str, str]):
    """The configuration ``jupyterhub_config.py`` makes from the site settings ``env``."""
    with _environ(env):
        return PyFileConfigLoader("jupyterhub_config.py", path=str(REPO)).load_config()


@dataclass
class Page:
    """One answer of the hub: its status, where it sends the browser, its words."""

    code: int
    location: str
    body: str
    headers: dict = field(default_factory=dict)

    @property
    def text(self) -> str:
        """What a person reads: the page without its tags, scripts and styles, its
        whitespace folded."""
        body = re.sub(r"(?is)<(script|style)\b.*?</\1>", " ", self.body)
        body = re.sub(r"(?s)<[^>]*>", " ", body)
        return re.sub(r"\s+", " ", html.unescape(body)).strip()


class PageHub:
    """A MockHub of gpulab's configuration, serving on 127.0.0.1 (see the module)."""

    def __init__(self, app: MockHub, env: dict[str, str]):
        self.app, self.env = app, env
        self.home = Path(env["GPULAB_HOME"])
        self._cookies: dict[str, str] = {}
        # The hub's own address (hub_ip:hub_port), where gpulab's pages that call the
        # hub's REST API (the Share page) find it; no proxy in front.
        self.port = app.hub.port
        sockets = bind_sockets(self.port, "127.0.0.1")
        self.server = HTTPServer(app.tornado_application)
        self.server.add_sockets(sockets)
        self.url = f"http://127.0.0.1:{self.port}"

    @property
    def db(self):
        return self.app.db

    def user(self, name: str, admin: bool = False):
        """The hub's user ``name`` (made if missing)."""
        return add_user(self.db, app=self.app, name=name, admin=admin)

    async def project(self, owner: str, name: str, display_name: str = ""):
        """A stopped project ``name`` of ``owner``: its JupyterHub server record and its
        folder (never started)."""
        return await asyncio.to_thread(self._project, owner, name, display_name)

    def _project(self, owner: str, name: str, display_name: str):
        user = self.user(owner)
        if name not in user.orm_user.orm_spawners:
            orm_spawner = orm.Spawner(name=name, user=user.orm_user)
            self.db.add(orm_spawner)
            self.db.commit()
        spawner = user.spawners[name]
        if display_name:
            spawner.orm_spawner.display_name = display_name
            self.db.commit()
        folder = self.home / "projects" / owner / name
        folder.mkdir(parents=True, exist_ok=True)
        return spawner

    async def share(self, owner: str, project: str, person: str, role: str) -> None:
        """Share ``owner``'s project with ``person`` as "viewer" or "collaborator", as
        the Share page does (JupyterHub's own share, gpulab's scopes). Setup, off the
        event loop's thread (gpulab keeps its group-share record in step at commit)."""
        await asyncio.to_thread(self._share, owner, project, person, role)

    def _share(self, owner: str, project: str, person: str, role: str) -> None:
        from gpulab_hub.sharing import roles

        spawner = self._project(owner, project, "").orm_spawner
        orm.Share.grant(
            self.db, spawner, self.user(person).orm_user, roles.share_scopes(role, owner, project)
        )
        self.db.commit()

    def cookies(self, name: str) -> str:
        """The Cookie header of ``name``'s browser after logging in: JupyterHub's signed
        login cookie (what its login page sets) and a session id."""
        if name not in self._cookies:
            user = self.user(name, admin=name == ADMIN)
            settings = self.app.tornado_settings
            login = create_signed_value(
                settings["cookie_secret"], self.app.hub.cookie_name, user.cookie_id
            ).decode()
            session = f"jupyterhub-session-id=fastlane{user.id}"
            self._cookies[name] = f"{self.app.hub.cookie_name}={login}; {session}"
        return self._cookies[name]

    async def get(self, path: str, as_user: str | None = None, **kw) -> Page:
        return await self.fetch(path, as_user, method="GET", **kw)

    async def fetch(self, path: str, as_user: str | None, method: str = "GET", **kw) -> Page:
        headers = dict(kw.pop("headers", {}))
        if as_user is not None:
            headers["Cookie"] = self.cookies(as_user)
        r: HTTPResponse = await AsyncHTTPClient().fetch(
            self.url + path,
            method=method,
            headers=headers,
            follow_redirects=False,
            raise_error=False,
            request_timeout=30,
            **kw,
        )
        body = r.body.decode(errors="replace") if r.body else ""
        return Page(r.code, r.headers.get("Location", ""), body, dict(r.headers))

    async def post_form(self, path: str, as_user: str, fields: dict[str, str]) -> Page:
        """Send one of the page's forms as ``as_user``'s browser does: the page first
        (for its XSRF token and cookie), then the form with that token."""
        page = await self.get(path, as_user)
        m = re.search(r'name="_xsrf" value="([^"]+)"', page.body)
        assert m, f"{path} has no form with an XSRF token"
        xsrf = html.unescape(m.group(1))
        cookie = re.search(r"_xsrf=([^;]+)", page.headers.get("Set-Cookie", ""))
        jar = self.cookies(as_user) + (f"; _xsrf={cookie.group(1)}" if cookie else "")
        headers = {"Cookie": jar}
        return await self.fetch(
            path,
            None,
            method="POST",
            headers=headers,
            body=urlencode({**fields, "_xsrf": xsrf}),
        )

    async def stop(self) -> None:
        self.server.stop()
        await self.server.close_all_connections()
        MockHub.clear_instance()
        self.app.db_file.close()


async def page_hub(home: Path, **extra: str) -> PageHub:
    """A MockHub of gpulab's configuration (site settings ``extra``), initialised and
    serving; its managed services are never started."""
    env = site_env(home, **extra)
    # Off the event loop's thread, as setup: the configuration reads (and locks) records.
    # (No GPU-figures reader starts: conftest.pytest_configure put an idle one in place.)
    config = await asyncio.to_thread(load_config, env)
    config.JupyterHub.log_level = "WARN"
    MockHub.clear_instance()
    app = MockHub.instance(config=config)
    with _environ(env):
        await app.initialize([])
    # gpulab's tables, as a hub start upgrades them (jupyterhub_config.py does it only in
    # a JupyterHub process, and this configuration was read before the MockHub was made)
    from gpulab_hub.db import migrate

    await asyncio.to_thread(migrate.upgrade, app.db_url)
    return PageHub(app, env)
