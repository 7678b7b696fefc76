"""The hub's routes as gpulab configures it, and asking them as each role (issue 13).

:func:`hub_routes` builds JupyterHub's own list in-process, the way the hub does at
start (``JupyterHub.init_handlers`` on gpulab's configuration: the authenticator's
pages, JupyterHub's pages and REST API, gpulab's ``extra_handlers``), plus the static
files route tornado adds. The tests compare it with their expectation tables, so a
route that a JupyterHub upgrade or gpulab adds FAILS until someone decides what it
needs, and ask each route of the running hub as anonymous, another user, a viewer
and a collaborator of a project, its owner and an admin without a share.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import requests
from people import log_in_admin, make_user, share_by_link
from tornado.util import import_object
from tornado.web import RequestHandler

OWNER, VIEWER, COLLAB, OTHER = "hmowner", "hmviewer", "hmcollab", "hmother"
PROJECT = "hubmx"  # shared with the viewer and the collaborator; running
RENAMED = "hmren"  # renamed by its owner in the tests of changes
ROLES = ("anonymous", "other", "viewer", "collaborator", "owner", "admin")
CHANGES = ("post", "put", "patch", "delete")
REFUSED = frozenset({401, 403})


def hub_routes() -> list[dict]:
    """Every URL pattern of the hub (first rule of each pattern wins, as in tornado),
    with its handler class and the methods it defines."""
    from jupyterhub.app import JupyterHub
    from traitlets.config import Config

    from gpulab_hub import hubconfig

    config = Config()
    env = {"GPULAB_HOME": "/nonexistent", "GPULAB_HUB_IP": "127.0.0.1"}
    hubconfig.apply(config, env, images_dir="/nonexistent")
    app = JupyterHub(config=config)
    app.log.setLevel(logging.ERROR)  # extra_handlers' deprecation warning
    cls = app.authenticator_class
    app.authenticator = cls.__new__(cls)  # get_handlers needs no database
    app.init_handlers()
    rules = [(app.hub_prefix + "static/(.*)", "tornado.web.StaticFileHandler")]
    rules += [(rule[0], rule[1]) for rule in app.handlers]
    rows, seen = [], set()
    for pattern, target in rules:
        if pattern in seen:
            continue
        seen.add(pattern)
        handler = import_object(target) if isinstance(target, str) else target
        methods = [
            m
            for m in ("get", *CHANGES)
            if getattr(handler, m, None) is not getattr(RequestHandler, m)
        ]
        name = f"{handler.__module__}.{handler.__qualname__}"
        rows.append({"pattern": pattern, "handler": name, "methods": methods})
    return rows


class People:
    """One owner with a project shared with a viewer and a collaborator (by share
    link), another user, an admin without a share, and anonymous, on one hub."""

    def __init__(self, hub):
        self.base = hub.url.rstrip("/")
        admin = log_in_admin(hub)
        made = {n: make_user(hub, admin, n) for n in (OWNER, VIEWER, COLLAB, OTHER)}
        self.users = {
            "admin": admin,
            "owner": made[OWNER],
            "viewer": made[VIEWER],
            "collaborator": made[COLLAB],
            "other": made[OTHER],
        }
        owner = self.users["owner"]
        for project in (PROJECT, RENAMED):  # makes and starts the project (a GET of the
            # spawn page never does: home/spawn.py)
            r = owner.api("POST", f"/hub/api/users/{OWNER}/servers/{project}", json={})
            assert r.status_code in (201, 202), r.text
        for project in (PROJECT, RENAMED):  # one known state for every row: running
            # (pending pages answer 200 while a start is under way, 302 once it is up)
            owner.wait_ready(project, timeout=300)
        share_by_link(owner, PROJECT, self.users["viewer"], "viewer")
        share_by_link(owner, PROJECT, self.users["collaborator"], "collaborator")
        self.anonymous = requests.Session()

    def session(self, role: str) -> requests.Session:
        return self.anonymous if role == "anonymous" else self.users[role].http

    def xsrf(self, role: str) -> str:
        if role == "anonymous":
            return ""
        return self.users[role].http.cookies.get("_xsrf", path="/hub/") or ""

    def ask(self, role: str, method: str, path: str, how: str, body=None) -> int:
        """One request: ``how`` is "token" (API token), "cookie" (browser session,
        no XSRF) or "xsrf" (browser session with its XSRF token: a form field for
        pages, the header for the API)."""
        url = self.base + path
        kw: dict = {"allow_redirects": False, "timeout": 20}
        if how == "token":
            http = requests
            if role != "anonymous":
                kw["headers"] = {"Authorization": f"token {self.users[role].token}"}
        else:
            http = self.session(role)
            xsrf = self.xsrf(role) if how == "xsrf" else ""
            if path.startswith("/hub/api/"):
                kw["headers"] = {"X-XSRFToken": xsrf} if xsrf else {}
            elif method != "GET":
                body = {**(body or {}), **({"_xsrf": xsrf} if xsrf else {})}
        if body is not None:
            kw["json" if path.startswith("/hub/api/") else "data"] = body
        try:
            try:
                return http.request(method, url, **kw).status_code
            except requests.ConnectionError:
                # The proxy closes a kept-alive connection after 5 idle seconds; a
                # request sent on it at that moment gets no answer. A browser sends it
                # again on a new connection, and so does this, once.
                return http.request(method, url, **kw).status_code
        except requests.Timeout:
            return 599

    def ask_all(self, jobs) -> list[int]:
        """``jobs``: (role, method, path, how, body) tuples; each role's requests run
        in order on one thread (one browser session each), the roles at once."""
        by_role: dict[str, list] = {}
        for i, job in enumerate(jobs):
            by_role.setdefault(job[0], []).append((i, job))
        out = [0] * len(jobs)

        def run(items):
            for i, job in items:
                out[i] = self.ask(*job)

        with ThreadPoolExecutor(len(by_role) or 1) as pool:
            list(pool.map(run, by_role.values()))
        return out


def how_for(path: str) -> str:
    return "token" if path.startswith("/hub/api/") else "cookie"


def statuses(text: str) -> dict[str, str]:
    """``"302 403 403 403 200 200"`` -> status per role (ROLES order); ``.`` is not
    asked (a change a role may make: the owner on their own things, admins)."""
    parts = text.split()
    assert len(parts) == len(ROLES), text
    return dict(zip(ROLES, parts, strict=True))
