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
any request to jupyter-server-proxy's        ``custom:gpulab:execute``
routes (TensorBoard, /proxy/<port>/…, its
launcher list), GET and OPTIONS included
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
at once (at most every 2 s) when someone's access is not in it. Every token needs
the scope, the owner's included: the owner's browser and API tokens carry
``execute`` through the ``user`` role; the server's own token
(``$JUPYTERHUB_API_TOKEN``, which belongs to the owner) carries none of gpulab's
scopes and is refused everything. Anyone else, admins included, needs a share:
without one every authorized request is refused. Unknown actions are refused.

Websockets are authorized when they open; :mod:`.connections` checks the open ones
again every ``connections_recheck_s`` seconds and closes those whose person lost
what they were allowed (a revoked or lowered share, a revoked token).

A request allowed to start a kernel, a terminal or a job also fetches, with the
person's own token, the secrets that person's new process gets (secrets/deliver.py).
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
from tornado.web import HTTPError
from tornado.websocket import WebSocketHandler
from traitlets import Float

from .connections import OpenConnections
from .freshrefusal import NAVIGATION_AGAIN_S, is_navigation, token_cache_key
from .secrets import deliver

PREFIX = "custom:gpulab:"
READ, WRITE, EXECUTE = PREFIX + "read", PREFIX + "write", PREFIX + "execute"
# Each scope, and the scopes that include it.
IMPLIED_BY = {READ: (READ, WRITE, EXECUTE), WRITE: (WRITE, EXECUTE), EXECUTE: (EXECUTE,)}
# Resources whose writes change files only.
FILE_RESOURCES = frozenset({"contents", "csp"})
# jupyter-server-proxy's routes: a visit starts a process (TensorBoard) or talks to a
# port in the container, so every request there, a GET too, needs "execute".
PROXY = "proxy"
EXECUTE_ONLY = frozenset({PROXY})
# Packages whose every route is on the PROXY resource (see guard_proxies).
PROXY_PACKAGES = frozenset({"jupyter_server_proxy"})
# The least time between two share listings asked for because someone was not in one.
REFRESH_MIN_S = 2.0


def needed_scope(action: str, resource: str) -> str | None:
    """The gpulab scope an ``action`` on ``resource`` needs; None: refused to everyone."""
    if resource in EXECUTE_ONLY and action in ("read", "write", "execute"):
        return EXECUTE
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


def _asks_only(handler) -> bool:
    """Whether ``handler`` asks what a person may do without refusing them for it (their
    answer is a False, not a 403): /api/me, and a collaboration room asking if its
    visitor may write (a viewer's room is read-only, not refused)."""
    cls = type(handler)
    named = f"{cls.__module__}.{cls.__qualname__}" in ASKS_ONLY
    return named or getattr(cls, "gpulab_asks_only", False)


def is_document_session(handler, action: str) -> bool:
    """jupyter-collaboration's PUT /api/collaboration/session/<path>: it only looks up or
    makes the file's id, which every reader needs to open a document."""
    cls = type(handler)
    return (
        action == "write"
        and cls.__name__ == "DocSessionHandler"
        and cls.__module__.startswith("jupyter_server_ydoc")
    )


def viewer_refusal(owner: str, project: str) -> str:
    """What a viewer is told when the server refuses them a change (one line; no "%",
    which tornado's error pages would read as a format)."""
    where = f"{owner}'s project {project}".replace("%", "")
    return (
        f"You are a viewer of {where}: you can read it, but not change or run anything "
        "here. Save a copy to work on it."
    )


# Handlers that ask the authorizer what a person may do, to tell them (never to refuse);
# a handler class may also say so itself (``gpulab_asks_only = True``).
ASKS_ONLY = frozenset({"jupyter_server.services.api.handlers.IdentityHandler"})


class ProjectAuthorizer(JupyterHubAuthorizer):
    """Default deny: each request needs the gpulab scope of the table above, from
    every token (no one is let in for being the owner: the owner's tokens carry it)."""

    shares_max_age = Float(
        30.0,
        help="Seconds a listing of this server's shares is used before it is asked for again "
        "(a revoked share stops working within this time).",
    ).tag(config=True)
    connections_recheck_s = Float(
        10.0,
        help="Seconds between two checks of the open websockets (kernels, terminals, "
        "collaboration rooms): one whose person lost the access it opened with is closed "
        "(0: never).",
    ).tag(config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # Read when the server makes its authorizer, not at import.
        self.owner = os.environ.get("JUPYTERHUB_USER", "")
        self.server_name = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
        self._shares: list[dict] = []
        self._fetched_at = -math.inf
        self._asked_at: dict[str, float] = {}  # who last made a refusal ask the hub, when
        self._lock: asyncio.Lock | None = None
        self._secrets: deliver.SecretsClient | None = None
        self.connections = OpenConnections(
            self._still_allowed, self.connections_recheck_s, self.log
        )

    async def is_authorized(self, handler, user, action, resource):
        # JupyterHub's own check (access to this server), kept as a second lock.
        if not super().is_authorized(handler, user, action, resource):
            return False
        hub_user = getattr(user, "hub_user", None) or {}
        allowed = await self.allows(hub_user, action, resource, handler)
        if allowed and isinstance(handler, WebSocketHandler):
            token = self.hub_auth.get_token(handler) or ""
            self.connections.watch(handler, token, action, resource)
        if allowed and deliver.starts_process(handler):
            token = self.hub_auth.get_token(handler) or ""
            # The start later in this request (same task) reads it: secrets/deliver.py.
            deliver.current.set(await self.secrets.delivery_for(token, hub_user["name"]))
        if not allowed and not _asks_only(handler):
            refusal = await self.refusal(hub_user)
            if refusal:  # in the role's words rather than "not authorized to write on …"
                raise HTTPError(403, refusal)
        return allowed

    async def refusal(self, hub_user: dict) -> str:
        """What this person is told when a change is refused: the viewer's words for
        someone who may read here but not write; "" for anyone else."""
        if await self.allows(hub_user, "write", "contents"):
            return ""
        if not await self.allows(hub_user, "read", "contents"):
            return ""
        return viewer_refusal(*self._where)

    async def allows(self, hub_user: dict, action: str, resource: str, handler=None) -> bool:
        """Whether JupyterHub's model of a token (``hub_user``) holds the scope that
        ``action`` on ``resource`` needs here, in itself or through a share."""
        needed = READ if is_document_session(handler, action) else needed_scope(action, resource)
        if needed is None or not hub_user.get("name"):
            return False
        own = set(hub_user.get("scopes") or ())
        if grants(own, needed, *self._where):
            return True
        if hub_user.get("kind", "user") != "user":
            return False  # services hold no shares
        allowed = grants(own | await self._shared(hub_user, fresh=False), needed, *self._where)
        if not allowed:
            page = is_navigation(getattr(handler, "request", None))
            shared = await self._shared(hub_user, fresh=True, page=page)
            allowed = grants(own | shared, needed, *self._where)
        if not allowed:
            self.log.info(
                "gpulab: %s may not %s %s (needs %s)", hub_user["name"], action, resource, needed
            )
        return allowed

    async def _still_allowed(self, handler, token: str, allowed) -> bool:
        """For an open websocket: whether ``token`` still reaches this server and may
        still do each (action, resource) in ``allowed`` (the hub asked afresh)."""
        session_id = self.hub_auth.get_session_id(handler)
        model = await self.hub_auth.user_for_token(
            token, use_cache=False, session_id=session_id, sync=False
        )
        # HubOAuth keeps each token's answer for cache_max_age (30 s): put the fresh one
        # there (user_for_token's own cache key), so a closed connection cannot reopen
        # with the stale answer.
        self.hub_auth.cache[token_cache_key(session_id, token)] = model
        if not model or not self.hub_auth.check_scopes(self.hub_auth.access_scopes, model):
            return False
        await self._shared(model, fresh=True)  # a listing at most REFRESH_MIN_S old
        for action, resource in allowed:
            if not await self.allows(model, action, resource, handler):
                return False
        return True

    @property
    def _where(self) -> tuple[str, str]:
        return self.owner, self.server_name

    @property
    def secrets(self) -> deliver.SecretsClient:
        """Asks the hub for the secrets of the person who starts a process here."""
        if self._secrets is None:
            self._secrets = deliver.SecretsClient(
                self.hub_auth.api_url, self.owner, self.server_name, self.log
            )
        return self._secrets

    async def _shared(self, hub_user: dict, fresh: bool, page: bool = False) -> frozenset[str]:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            now = time.monotonic()
            age = now - self._fetched_at
            # A refusal asks the hub again if the listing is older than REFRESH_MIN_S, or
            # if this person has not made it ask in that time: someone who accepted a
            # share a moment after the last listing gets in at once, and one person's
            # refused requests still make the hub answer at most every REFRESH_MIN_S.
            # A refused page load (``page``: the project opened after accepting a link)
            # asks again once the listing is NAVIGATION_AGAIN_S old: a tab of theirs
            # still polling here since a revoke keeps the listing fresher than
            # REFRESH_MIN_S and their own ask recent (freshrefusal.py).
            name = hub_user.get("name", "")
            first_ask = now - self._asked_at.get(name, -math.inf) > REFRESH_MIN_S
            again = age > REFRESH_MIN_S or first_ask or (page and age > NAVIGATION_AGAIN_S)
            if age > self.shares_max_age or (fresh and again):
                self._asked_at = {
                    n: t for n, t in self._asked_at.items() if now - t <= REFRESH_MIN_S
                }
                self._asked_at[name] = now
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
# JupyterLab's own routes (pages, settings, workspaces, extension and plugin manager,
# builds), jupyter-collaboration's room websocket and others are only
# @web.authenticated: the authorizer above is not asked. ``guard_routes`` wraps every
# such method: those that change something (POST, PUT, PATCH, DELETE) in
# jupyter_server's ``@authorized`` as a "write", so they need ``execute`` (or
# ``write`` for a handler whose resource is "contents"); GET and HEAD as a "read"
# (``read``), after authentication, so that a browser not yet logged in is still
# sent to log in.

MUTATING = ("post", "put", "patch", "delete")
READING = ("get", "head")
# Handlers that let anyone in (``@allow_unauthenticated``) but answer a logged-in
# person more: they ask the authorizer too (/metrics: request and kernel counts).
ASK_ANYWAY = frozenset({"jupyter_server.base.handlers.PrometheusMetricsHandler"})


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
    """Whether ``method`` is (or wraps) one made by jupyter_server's ``@authorized``
    or by :func:`read_guard`."""
    code = _authorized_code()
    seen = 0
    while method is not None and seen < 20:
        if getattr(method, "__code__", None) is code or getattr(method, "__gpulab_reads__", 0):
            return True
        method = getattr(method, "__wrapped__", None)
        seen += 1
    return False


def read_guard(method, resource: str):
    """``method`` (a GET or HEAD) asking the authorizer for "read" on ``resource``
    first. A request without a user is handled as ``@web.authenticated`` does
    (redirect to log in, or 403), never by ``method`` itself."""
    import functools
    import inspect

    from jupyter_core.utils import ensure_async
    from tornado import web

    @functools.wraps(method)
    async def reading(self, *args, **kwargs):
        user = self.current_user
        if not user:
            out = web.authenticated(method)(self, *args, **kwargs)
        elif await ensure_async(self.authorizer.is_authorized(self, user, "read", resource)):
            out = method(self, *args, **kwargs)
        else:
            raise web.HTTPError(403, f"User is not authorized to read on resource: {resource}.")
        return await out if inspect.isawaitable(out) else out

    reading.__gpulab_reads__ = 1
    return reading


def is_proxy(cls) -> bool:
    """Whether handler class ``cls`` comes from jupyter-server-proxy (its named servers'
    handler classes are made in its ``config`` module, so they count too)."""
    return cls.__module__.split(".", 1)[0] in PROXY_PACKAGES


def execute_guard(prepare):
    """A handler's ``prepare`` that, once the person is known, asks the authorizer for
    "execute" on :data:`PROXY`: every method (OPTIONS too, which ``guard_routes``
    does not wrap) and every websocket of the handler is refused without it."""
    import functools
    import inspect

    from jupyter_core.utils import ensure_async
    from tornado import web

    @functools.wraps(prepare)
    async def preparing(self, *args, **kwargs):
        out = prepare(self, *args, **kwargs)
        if inspect.isawaitable(out):
            await out
        if self._finished:  # sent to log in
            return
        user = self.current_user
        if not user:
            raise web.HTTPError(403)
        if not await ensure_async(self.authorizer.is_authorized(self, user, "execute", PROXY)):
            raise web.HTTPError(403, f"User is not authorized to execute on resource: {PROXY}.")

    preparing.__gpulab_executes__ = 1
    return preparing


def guard_proxies(classes) -> list[str]:
    """jupyter-server-proxy's handlers only ask for a login (its ``prepare``): each now
    needs "execute" on :data:`PROXY` for every request. Names of the classes guarded
    here."""
    done = []
    # Parents first: a subclass then inherits its parent's guarded prepare.
    for cls in sorted(classes, key=lambda c: (len(c.__mro__), c.__qualname__)):
        if not is_proxy(cls):
            continue
        cls.auth_resource = PROXY  # what guard_routes' wrapped methods ask for
        if getattr(cls.prepare, "__gpulab_executes__", 0):
            continue  # guarded, or a subclass of a guarded class
        cls.prepare = execute_guard(cls.prepare)
        done.append(f"{cls.__module__}.{cls.__qualname__}.prepare")
    return sorted(done)


def guard_routes(rules) -> list[str]:
    """Make each method of the rules' handlers ask the authorizer; names of the
    methods guarded here."""
    from jupyter_server.auth.decorator import authorized
    from jupyter_server.base.handlers import JupyterHandler
    from tornado.web import RequestHandler

    classes = {rule.target for rule in rules}
    done = guard_proxies(c for c in classes if issubclass(c, JupyterHandler))
    for cls in classes:
        if not issubclass(cls, JupyterHandler):
            continue
        for name in MUTATING + READING:
            method = getattr(cls, name, None)
            if method is None or method is getattr(RequestHandler, name, None):
                continue
            open_to_all = getattr(method, "__allow_unauthenticated", False)
            if open_to_all and f"{cls.__module__}.{cls.__qualname__}" in ASK_ANYWAY:
                open_to_all = name not in READING
            if asks_authorizer(method) or open_to_all:
                continue
            resource = getattr(cls, "auth_resource", None) or "unknown"
            if name in READING:
                setattr(cls, name, read_guard(method, resource))
            else:
                setattr(cls, name, authorized("write", resource=resource)(method))
            done.append(f"{cls.__module__}.{cls.__qualname__}.{name}")
    return sorted(done)


def mend_licenses(rules) -> list[str]:
    """jupyterlab_server's ``LicensesHandler.finish`` needs a MIME type that tornado's
    error path never passes: every error answer there (a 403 from the authorizer, for
    anyone without a share) raised in the error handler and left the request open for
    ever, so anyone could hold connections of someone's server. Its ``finish`` now
    takes the MIME type as a keyword only; without it, an ordinary API answer. Names of
    the classes mended here."""
    from jupyter_server.base.handlers import APIHandler

    done = []
    for cls in {rule.target for rule in rules}:
        name = f"{cls.__module__}.{cls.__qualname__}"
        if name != "jupyterlab_server.licenses_handler.LicensesHandler":
            continue
        if getattr(cls.finish, "__gpulab_mended__", False):
            continue
        original = cls.finish

        def finish(self, *args, _mime_type=None, _original=original, **kwargs):
            if _mime_type is None:
                return APIHandler.finish(self, *args, **kwargs)
            return _original(self, *args, _mime_type=_mime_type, **kwargs)

        finish.__gpulab_mended__ = True
        cls.finish = finish
        done.append(name)
    return done
