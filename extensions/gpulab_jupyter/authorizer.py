"""Who may do what on a project's server: gpulab's viewer and collaborator roles.

gpulab's hub starts project servers with
``--ServerApp.authorizer_class=gpulab_jupyter.authorizer.ProjectAuthorizer``;
a plain JupyterLab without the hub never loads this module.

JupyterHub has already checked that the person may reach this server at all
(``access:servers``). This authorizer then asks for one of gpulab's custom
scopes, limited to this server (``!server=<owner>/<project>``) or to its owner
(``!user=<owner>``), for each request:

==========================================  ======================================
request                                     scope needed
==========================================  ======================================
any read (GET): files, contents, lab         ``custom:gpulab:read``
pages, kernelspecs, session and kernel
lists, /api/me, collaboration room (RTC)
writing files: contents PUT/PATCH/POST/      ``custom:gpulab:write``
DELETE, checkpoints, CSP reports
anything else that is not a read: kernels,   ``custom:gpulab:execute``
sessions, terminals (and their websockets),
nbconvert, config, events, language servers,
shutdown, JupyterLab settings, workspaces,
extension manager, builds, unknown routes
==========================================  ======================================

``execute`` includes ``write`` and ``read``; ``write`` includes ``read``.
Starting a kernel is a POST on kernels, so a viewer (``read``) cannot.
One exception: jupyter-collaboration's "document session" PUT only registers a
file id for a path, so it counts as a read (a viewer must open notebooks).

Where the scopes come from: the person's token (API tokens carry the scopes of
the person's shares; an admin may also grant gpulab's scopes through roles),
and, since JupyterHub puts no share's custom scopes into the browser's OAuth
token, the hub's list of this server's shares (``GET /hub/api/shares/<owner>/
<project>``, with the server's own token, which gpulab's hub gives
``read:shares!server``), refreshed at most every ``shares_max_age`` seconds and
at once (at most every 2 s) when someone's access is not in it. The owner may do
everything. Anyone else, admins included, needs a share: without one every
authorized request is refused. Unknown actions are refused.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from urllib.parse import quote, urlencode

from jupyterhub.services.auth import check_scopes
from jupyterhub.singleuser.extension import JupyterHubAuthorizer
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from traitlets import Float

PREFIX = "custom:gpulab:"
READ, WRITE, EXECUTE = PREFIX + "read", PREFIX + "write", PREFIX + "execute"
# Each scope, and the scopes that include it.
IMPLIED_BY = {READ: (READ, WRITE, EXECUTE), WRITE: (WRITE, EXECUTE), EXECUTE: (EXECUTE,)}
# Resources whose writes change files only.
FILE_RESOURCES = frozenset({"contents", "csp"})
# The least time between two share listings asked for because someone was not in one.
REFRESH_MIN_S = 2.0


def needed_scope(action: str, resource: str) -> str | None:
    """The gpulab scope an ``action`` on ``resource`` needs; None: refused to everyone."""
    if action == "read":
        return READ
    if action == "write":
        return WRITE if resource in FILE_RESOURCES else EXECUTE
    if action == "execute":
        return EXECUTE
    return None


def grants(scopes, needed: str, owner: str, server: str) -> bool:
    """Whether ``scopes`` hold ``needed`` (or a scope including it) on ``owner/server``."""
    if needed not in IMPLIED_BY:
        return False
    required = {f"{scope}!server={owner}/{server}" for scope in IMPLIED_BY[needed]}
    return bool(check_scopes(required, set(scopes)))


def shared_scopes(shares, name: str, groups) -> frozenset[str]:
    """The scopes that the shares (JupyterHub share models) give user ``name`` in ``groups``."""
    groups = set(groups or ())
    found: set[str] = set()
    for share in shares:
        user, group = share.get("user") or {}, share.get("group") or {}
        if user.get("name") == name or (group.get("name") and group["name"] in groups):
            found.update(share.get("scopes") or ())
    return frozenset(found)


def is_document_session(handler, action: str) -> bool:
    """jupyter-collaboration's PUT /api/collaboration/session/<path>: it only looks up or
    makes the file's id, which every reader needs to open a document."""
    cls = type(handler)
    return (
        action == "write"
        and cls.__name__ == "DocSessionHandler"
        and cls.__module__.startswith("jupyter_server_ydoc")
    )


class ProjectAuthorizer(JupyterHubAuthorizer):
    """Default deny: each request needs the gpulab scope of the table above."""

    shares_max_age = Float(
        30.0,
        help="Seconds a listing of this server's shares is used before it is asked for again "
        "(a revoked share stops working within this time).",
    ).tag(config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # Read when the server makes its authorizer, not at import.
        self.owner = os.environ.get("JUPYTERHUB_USER", "")
        self.server_name = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
        self._shares: list[dict] = []
        self._fetched_at = -math.inf
        self._lock: asyncio.Lock | None = None

    def is_owner(self, hub_user: dict) -> bool:
        return hub_user.get("kind", "user") == "user" and hub_user.get("name") == self.owner

    async def is_authorized(self, handler, user, action, resource):
        # JupyterHub's own check (access to this server), kept as a second lock.
        if not super().is_authorized(handler, user, action, resource):
            return False
        needed = READ if is_document_session(handler, action) else needed_scope(action, resource)
        hub_user = getattr(user, "hub_user", None) or {}
        if needed is None or not hub_user.get("name"):
            return False
        if self.is_owner(hub_user):
            return True
        own = set(hub_user.get("scopes") or ())
        if grants(own, needed, self.owner, self.server_name):
            return True
        allowed = grants(own | await self._shared(hub_user, fresh=False), needed, *self._where)
        if not allowed:
            allowed = grants(own | await self._shared(hub_user, fresh=True), needed, *self._where)
        if not allowed:
            self.log.info(
                "gpulab: %s may not %s %s (needs %s)", hub_user["name"], action, resource, needed
            )
        return allowed

    @property
    def _where(self) -> tuple[str, str]:
        return self.owner, self.server_name

    async def _shared(self, hub_user: dict, fresh: bool) -> frozenset[str]:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            age = time.monotonic() - self._fetched_at
            if age > self.shares_max_age or (fresh and age > REFRESH_MIN_S):
                self._shares = await self._fetch_shares()
                self._fetched_at = time.monotonic()
            shares = self._shares
        return shared_scopes(shares, hub_user["name"], hub_user.get("groups"))

    async def _fetch_shares(self) -> list[dict]:
        """This server's shares, from the hub (every page); [] when the hub refuses."""
        auth = self.hub_auth
        where = f"/shares/{quote(self.owner, safe='')}/{quote(self.server_name, safe='')}"
        shares: list[dict] = []
        offset = 0
        while True:
            url = auth.api_url.rstrip("/") + where + "?" + urlencode({"offset": offset})
            request = HTTPRequest(
                url,
                headers={"Authorization": f"token {auth.api_token}"},
                request_timeout=20,
            )
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
            if response.code != 200:
                self.log.warning(
                    "gpulab: the hub's list of this server's shares: %s %s",
                    response.code,
                    (response.body or b"")[:200],
                )
                return shares
            page = json.loads(response.body)
            items = page.get("items") or []
            shares.extend(items)
            following = (page.get("_pagination") or {}).get("next")
            if not following or not items:
                return shares
            offset = int(following.get("offset", offset + len(items)))


# --- routes that never ask the authorizer --------------------------------------------
# JupyterLab's own routes (settings, workspaces, extension and plugin manager, builds)
# are only @web.authenticated: the authorizer above is not asked. ``guard_routes``
# wraps every such method that changes something (POST, PUT, PATCH, DELETE) in
# jupyter_server's ``@authorized`` as a "write", so they need ``execute`` (or ``write``
# for a handler whose resource is "contents").

MUTATING = ("post", "put", "patch", "delete")


def all_rules(web_app) -> list:
    """Every routing rule of a tornado application whose target is a handler class."""
    found, pending = [], [web_app.default_router]
    while pending:
        for rule in getattr(pending.pop(), "rules", ()):
            if isinstance(rule.target, type):
                found.append(rule)
            else:
                pending.append(rule.target)
    return found


def _authorized_code():
    from jupyter_server.auth.decorator import authorized

    return authorized(lambda self: None).__code__


def asks_authorizer(method) -> bool:
    """Whether ``method`` is (or wraps) one made by jupyter_server's ``@authorized``."""
    code = _authorized_code()
    seen = 0
    while method is not None and seen < 20:
        if getattr(method, "__code__", None) is code:
            return True
        method = getattr(method, "__wrapped__", None)
        seen += 1
    return False


def guard_routes(rules) -> list[str]:
    """Make each mutating method of the rules' handlers ask the authorizer; names of
    the methods guarded here."""
    from jupyter_server.auth.decorator import authorized
    from jupyter_server.base.handlers import JupyterHandler
    from tornado.web import RequestHandler

    done = []
    for cls in {rule.target for rule in rules}:
        if not issubclass(cls, JupyterHandler):
            continue
        for name in MUTATING:
            method = getattr(cls, name, None)
            if method is None or method is getattr(RequestHandler, name, None):
                continue
            if asks_authorizer(method) or getattr(method, "__allow_unauthenticated", False):
                continue
            resource = getattr(cls, "auth_resource", None) or "unknown"
            setattr(cls, name, authorized("write", resource=resource)(method))
            done.append(f"{cls.__module__}.{cls.__qualname__}.{name}")
    return sorted(done)
