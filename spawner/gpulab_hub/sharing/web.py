"""The hub page /hub/gpulab/share/<project>: the owner shares a project.

Each share is made as a viewer (read-only) or a collaborator (see roles.py).
The owner's listing, links and revoking go through JupyterHub's sharing REST
API (``/hub/api/shares``, ``/hub/api/share-codes``) with a short-lived token of
the logged-in owner, limited to that one project, so JupyterHub's own
permission checks apply; the token is deleted when the request is done.
Sharing with a user or group by name is done here with JupyterHub's
``orm.Share.grant``: its API would need every user to hold ``read:users:name``.

Re-share: /hub/gpulab/share/<owner>/<project> serves a collaborator of that
project when its owner allowed re-sharing (policy.py). They may share it with a
user, a group or by link, as viewer or collaborator (at most their own role),
and see who has access; they cannot revoke anything (JupyterHub does not record
who made a share) or change the owner's settings. The hub holds no ``shares``
permission of theirs on that server, so this page does it with JupyterHub's
``orm`` after its own checks. Anyone else gets 404 (403 for a collaborator
whose owner did not allow it).

``?embed=1`` renders the page without the hub's navigation bar and lets
same-origin pages frame it (JupyterLab's Share dialog shows it in an iframe).

The page's records (sharing settings, link access, group-share roles) are read and
written on the records pool (blocking.py), never on the hub's event loop; JupyterHub's
database stays on the loop. A record held too long elsewhere shows as 503 with words
(blocking.Busy is an HTTPError).
"""

from __future__ import annotations

import json
from datetime import UTC
from urllib.parse import quote, urlencode

from jupyterhub import orm
from jupyterhub.handlers import BaseHandler
from jupyterhub.utils import utcnow
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from gpulab_hub import accounts, blocking, hubsettings, jsonfile
from gpulab_hub.projects.title import title
from gpulab_hub.sharing import linkaccess, origins, roles
from gpulab_hub.sharing.groupshares import GroupShareRoles
from gpulab_hub.sharing.policy import ProjectSharing, SharingPolicyStore

TOKEN_SECONDS = 120
SETTINGS = ("collaborators_may_start", "collaborators_may_reshare")


class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def iso(when) -> str | None:
    return when.replace(tzinfo=UTC).isoformat() if when else None


class ShareHandler(BaseHandler):
    def initialize(self, max_hours: int, default_hours: int):
        self.max_hours = max_hours
        self.default_hours = default_hours
        where = hubsettings.of_handler(self)  # the hub's own configuration
        self.policy = SharingPolicyStore(where.db_url)
        self.group_roles = GroupShareRoles(where.group_share_roles)
        self.links = linkaccess.store_in(where.records_dir)

    @property
    def embed(self) -> bool:
        return self.get_query_argument("embed", "") == "1"

    @property
    def content_security_policy(self):
        """JupyterHub forbids framing its pages; the embedded share page allows its own
        origin (JupyterLab's Share dialog) and, with subdomains, the project owner's
        (see :meth:`allow_framing_by`), no other."""
        csp = origins.configured_csp(self)
        return origins.framed_by(csp, "'self'") if self.embed else csp

    def set_default_headers(self):
        super().set_default_headers()
        # The hub's configured CSP (tornado_settings['headers']) would replace ours.
        self.set_header(origins.CSP_HEADER, self.content_security_policy)

    def allow_framing_by(self, owner: str) -> None:
        """With subdomains, JupyterLab runs on the owner's origin, not the hub's."""
        user = self.find_user(owner) if self.embed and self.subdomain_host else None
        if user is not None:
            csp = origins.framed_by(origins.configured_csp(self), "'self'", user.host)
            self.set_header(origins.CSP_HEADER, csp)

    # --- who may use the page, on which project -------------------------------------
    async def _target(self, first: str, second: str | None) -> tuple[str, str, bool]:
        """(owner, project, resharing) of the request, or 404/403."""
        me = self.current_user
        if second is None or first == me.name:
            project = first if second is None else second
            if project not in me.orm_spawners:
                raise web.HTTPError(404, f"You have no project named {project!r}.")
            return me.name, project, False
        spawner = self._spawner(first, second)
        if spawner is None or self._my_role(spawner) != "collaborator":
            raise web.HTTPError(404, f"No project {first}/{second} is shared with you.")
        if not (await self._settings(first, second)).collaborators_may_reshare:
            raise web.HTTPError(403, f"{first} has not allowed sharing {second} on.")
        return first, second, True

    def _spawner(self, owner: str, project: str):
        user = orm.User.find(self.db, owner)
        return user.orm_spawners.get(project) if user is not None else None

    def _my_role(self, spawner) -> str:
        return roles.role_on(self.db, self.current_user.orm_user, spawner)

    async def _settings(self, owner: str, project: str):
        if self.policy is None:
            return ProjectSharing()
        return await blocking.run(blocking.RECORDS, self.policy.get, owner, project)

    # --- the owner's calls to JupyterHub's REST API ---------------------------------
    def _token(self, project: str) -> str:
        owner = self.current_user.name
        server = f"{owner}/{project}"
        return self.current_user.new_api_token(
            note=f"gpulab share page ({project})",
            expires_in=TOKEN_SECONDS,
            scopes=[
                f"shares!server={server}",
                f"access:servers!server={server}",
                # share codes may carry gpulab's role scopes (JupyterHub checks them)
                f"{roles.EXECUTE}!server={server}",
            ],
        )

    def _drop_token(self, token: str | None) -> None:
        found = orm.APIToken.find(self.db, token) if token else None
        if found is not None:
            self.db.delete(found)
            self.db.commit()

    async def _api(self, token: str, method: str, path: str, body=None, query=None):
        """One call to the hub's REST API as the owner; the decoded reply, or ApiError."""
        # The hub's own address (it may listen only on gpulab's bridge network).
        ip = self.hub.ip if self.hub.ip not in ("", "0.0.0.0", "::") else "127.0.0.1"
        url = f"{self.hub.proto}://{ip}:{self.hub.port}{self.hub.base_url}api{path}"
        if query:
            url += "?" + urlencode(query)
        request = HTTPRequest(
            url,
            method=method,
            headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
            body=None if body is None else json.dumps(body),
            allow_nonstandard_methods=True,
            request_timeout=30,
        )
        response = await AsyncHTTPClient().fetch(request, raise_error=False)
        text = response.body.decode(errors="replace") if response.body else ""
        if response.code >= 400:
            try:
                message = json.loads(text).get("message") or text
            except ValueError:
                message = text or response.reason
            raise ApiError(response.code, message)
        return json.loads(text) if text else None

    async def _listing(self, token: str | None, owner: str, project: str) -> dict:
        if token is None:  # re-share: read the hub's tables
            return self._listing_orm(self._spawner(owner, project))
        where = f"/{quote(owner)}/{quote(project)}"
        shares = await self._api(token, "GET", "/shares" + where)
        codes = await self._api(token, "GET", "/share-codes" + where)
        return {"shares": shares["items"], "codes": codes["items"]}

    def _listing_orm(self, spawner) -> dict:
        now = utcnow(with_tz=False)
        shares = self.db.query(orm.Share).filter_by(spawner_id=spawner.id)
        codes = self.db.query(orm.ShareCode).filter_by(spawner_id=spawner.id)
        return {
            "shares": [
                {
                    "scopes": s.scopes,
                    "user": {"name": s.user.name} if s.user else None,
                    "group": {"name": s.group.name} if s.group else None,
                    "kind": "group" if s.group else "user",
                    "created_at": iso(s.created_at),
                }
                for s in shares
            ],
            "codes": [
                {
                    "scopes": c.scopes,
                    "id": f"sc_{c.id}",
                    "expires_at": iso(c.expires_at),
                    "exchange_count": c.exchange_count,
                }
                for c in codes
                if c.expires_at is None or c.expires_at > now
            ],
        }

    # --- the form's actions ---------------------------------------------------------
    def _hours(self) -> int:
        try:
            hours = int(self.get_body_argument("hours", str(self.default_hours)))
        except ValueError as e:
            raise ApiError(400, "Hours must be a whole number.") from e
        if not 1 <= hours <= self.max_hours:
            raise ApiError(400, f"A link lasts from 1 to {self.max_hours} hours.")
        return hours

    def _lasts(self) -> str:
        lasts = self.get_body_argument("lasts", linkaccess.DEFAULT_LASTS)
        if lasts not in linkaccess.LASTS:
            raise ApiError(400, "Choose how long access through the link lasts.")
        return lasts

    def _code(self, code_id: str):
        """The ``orm.ShareCode`` of an id as JupyterHub's API gives it (``sc_<n>``)."""
        number = code_id.removeprefix("sc_")
        return self.db.get(orm.ShareCode, int(number)) if number.isdigit() else None

    def _role(self) -> str:
        role = self.get_body_argument("role", roles.DEFAULT_ROLE)
        if role not in roles.ROLES:
            raise ApiError(400, f"Choose a role: {', '.join(sorted(roles.ROLES))}.")
        return role

    async def _grant(self, owner, project, kind: str, name: str, resharing: bool) -> str:
        """Share with a user or group by name: what POST /hub/api/shares/... does, less its
        need of ``read:users:name`` (gpulab does not let users list each other)."""
        role = self._role()
        if not resharing and not self.has_scope(f"shares!server={owner}/{project}"):
            raise ApiError(403, "You may not share this project.")
        if not name:
            raise ApiError(400, f"Name the {kind} to share with.")
        if kind == "user":
            # An approved account that never logged in is a user all the same.
            target = accounts.approved_hub_user(self, name)
            if target is not None and target.name == owner:
                whose = f"{owner}'s" if resharing else "yours"
                raise ApiError(400, f"The project is {whose} already.")
            if target is not None and target.id == self.current_user.orm_user.id:
                raise ApiError(400, "You have access already.")
        else:
            target = orm.Group.find(self.db, name)
        if target is None and kind == "user":
            raise ApiError(
                400,
                f"No gpulab account named {name}. Check the spelling; someone who just "
                "signed up can be shared with once an administrator has approved them.",
            )
        if target is None:
            raise ApiError(400, f"No group named {name}.")
        spawner = self._spawner(owner, project)
        scopes = roles.share_scopes(role, owner, project)
        if not resharing:
            # The owner sets the role: a collaborator made viewer loses the rest.
            others = {f"{scope}!server={owner}/{project}" for scope in roles.ROLES.values()}
            orm.Share.revoke(self.db, spawner, target, scopes=sorted(others - set(scopes)))
        # A re-share only adds: it never lowers anyone's access.
        orm.Share.grant(self.db, spawner, target, scopes=scopes)
        # Shared by name: nothing of theirs ends with a link any more.
        await blocking.run(
            blocking.RECORDS, self.links.lasts_until_revoked, owner, project, kind, target.name
        )
        return f"Shared with {kind} {name} as {role}. Their access lasts until you revoke it."

    async def _link(self, token, owner: str, project: str) -> tuple[str, dict]:
        hours = self._hours()
        role = self._role()
        lasts = self._lasts()
        scopes = roles.share_scopes(role, owner, project)
        if token is None:
            share_code, code = orm.ShareCode.new(
                self.db, self._spawner(owner, project), scopes=scopes, expires_in=hours * 3600
            )
            link = {
                "accept_url": f"{self.hub.base_url}accept-share?{urlencode({'code': code})}",
                "expires_at": iso(share_code.expires_at),
            }
        else:
            where = f"/{quote(owner)}/{quote(project)}"
            body = {"expires_in": hours * 3600, "scopes": scopes}
            link = await self._api(token, "POST", "/share-codes" + where, body)
            share_code = self._code(link.get("id", ""))
        if share_code is None:
            raise ApiError(500, "The link was made but cannot be found; make another.")
        key = linkaccess.code_key(share_code)
        try:
            await blocking.run(blocking.RECORDS, self.links.mark_key, key, share_code.id, lasts)
        except (jsonfile.RecordError, OSError, blocking.Busy) as e:
            # A link whose access would last longer than the owner chose is never sent.
            self.db.delete(share_code)
            self.db.commit()
            raise ApiError(500, f"The link was not made: {e}") from e
        link["lasts"] = lasts
        request = self.request
        link["full_accept_url"] = f"{request.protocol}://{request.host}{link['accept_url']}"
        ends = (
            "access through it ends when it expires"
            if lasts == linkaccess.LINK
            else "access through it lasts until you revoke it"
        )
        message = f"Link made ({role}); it works for {hours} h, only for logged-in users; {ends}."
        return message, link

    async def _act(self, token, owner: str, project: str, resharing: bool):
        """Do the form's action; what to tell the user, and the new link if one was made."""
        action = self.get_body_argument("action", "")
        name = self.get_body_argument("name", "").strip()
        if action in ("user", "group"):
            return await self._grant(owner, project, action, name, resharing), None
        if action == "link":
            return await self._link(token, owner, project)
        if resharing:
            raise ApiError(403, "Only the owner may revoke access or change settings.")
        where = f"/{quote(owner)}/{quote(project)}"
        if action in ("revoke-user", "revoke-group"):
            kind = action.removeprefix("revoke-")
            await self._api(token, "PATCH", "/shares" + where, {kind: name})
            return f"Revoked the access of {kind} {name}.", None
        if action == "revoke-link":
            code = self._code(name)
            key = linkaccess.code_key(code) if code is not None else ""
            await self._api(token, "DELETE", "/share-codes" + where, query={"id": name})
            ended = await self.links.end_link_async(self.db, key) if key else 0
            if ended:
                return f"Link revoked; the access it gave ended ({ended} people).", None
            return "Link revoked.", None
        if action == "settings" and self.policy is not None:
            chosen = set(self.get_body_arguments("allow"))
            values = {key: key in chosen for key in SETTINGS}
            try:
                await blocking.run(blocking.RECORDS, self.policy.set, owner, project, **values)
            except SharingPolicyStore.Error as e:
                self.log.error("gpulab: %s", e)
                raise ApiError(503, "The settings were not saved: try again in a minute.") from e
            return "Settings saved.", None
        raise ApiError(400, f"Unknown action {action!r}.")

    # --- the page -------------------------------------------------------------------
    async def _page(self, owner, project, resharing, status=200, message="", error="", link=None):
        spawner = self._spawner(owner, project)
        if self.group_roles is not None and spawner is not None:
            # Group shares reach members' tokens only through roles (see groupshares.py).
            await self.group_roles.sync_project_async(self.db, spawner)
        token = None if resharing else self._token(project)
        try:
            listing = await self._listing(token, owner, project)
        except ApiError as e:
            raise web.HTTPError(e.status, str(e)) from e
        finally:
            self._drop_token(token)
        for entry in listing["shares"] + listing["codes"]:
            entry["role"] = roles.role_of(entry.get("scopes") or ())
        records = await blocking.run(blocking.RECORDS, self.links.snapshot)
        for share in listing["shares"]:
            who = (share.get("user") or share.get("group") or {}).get("name", "")
            ends = linkaccess.ends_in(records, owner, project, share.get("kind", "user"), who)
            share["ends_at"] = ends + "Z" if ends else ""
        for code in listing["codes"]:
            found = self._code(code.get("id", ""))
            key = linkaccess.code_key(found) if found else ""
            code["lasts"] = linkaccess.lasts_in(records, key)
        html = await self.render_template(
            "gpulab-share.html",
            project=project,
            project_title=title(spawner) if spawner is not None else project,
            owner=owner,
            resharing=resharing,
            embed=self.embed,
            form_action=self.request.path + ("?embed=1" if self.embed else ""),
            project_url=f"{self.base_url}user/{quote(owner)}/{quote(project)}/",
            settings=await self._settings(owner, project),
            can_set=self.policy is not None and not resharing,
            role_names=list(roles.ROLES),
            default_role=roles.DEFAULT_ROLE,
            role_words=roles.ROLE_WORDS,
            lasts_choices=linkaccess.LASTS,
            default_lasts=linkaccess.DEFAULT_LASTS,
            message=message,
            error=error,
            new_link=link,
            max_hours=self.max_hours,
            default_hours=self.default_hours,
            **listing,
        )
        self.set_status(status)
        self.finish(html)

    @web.authenticated
    async def get(self, first: str, second: str | None = None):
        owner, project, resharing = await self._target(first, second)
        self.allow_framing_by(owner)
        await self._page(owner, project, resharing)

    @web.authenticated
    async def post(self, first: str, second: str | None = None):
        owner, project, resharing = await self._target(first, second)
        self.allow_framing_by(owner)
        token = None if resharing else self._token(project)
        try:
            message, link = await self._act(token, owner, project, resharing)
        except ApiError as e:
            await self._page(owner, project, resharing, status=e.status, error=str(e))
            return
        finally:
            self._drop_token(token)
        await self._page(owner, project, resharing, message=message, link=link)
