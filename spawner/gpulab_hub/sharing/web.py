"""The hub page /hub/gpulab/share/<project>: the owner shares a project.

Listing, links and revoking go through JupyterHub's sharing REST API
(``/hub/api/shares``, ``/hub/api/share-codes``) with a short-lived token of the
logged-in owner, limited to that one project, so JupyterHub's own permission
checks apply; the token is deleted when the request is done. Sharing with a
user or group by name is done here with JupyterHub's ``orm.Share.grant``: its
API would need every user to hold ``read:users:name`` (the names of all users).
"""

from __future__ import annotations

import json
from urllib.parse import quote, urlencode

from jupyterhub import orm
from jupyterhub.handlers import BaseHandler
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

TOKEN_SECONDS = 120


class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class ShareHandler(BaseHandler):
    def initialize(self, max_hours: int, default_hours: int):
        self.max_hours = max_hours
        self.default_hours = default_hours

    def _check_owner(self, project: str) -> None:
        if project not in self.current_user.orm_spawners:
            raise web.HTTPError(404, f"You have no project named {project!r}.")

    def _token(self, project: str) -> str:
        owner = self.current_user.name
        server = f"{owner}/{project}"
        return self.current_user.new_api_token(
            note=f"gpulab share page ({project})",
            expires_in=TOKEN_SECONDS,
            scopes=[
                f"shares!server={server}",
                f"access:servers!server={server}",
            ],
        )

    def _drop_token(self, token: str) -> None:
        found = orm.APIToken.find(self.db, token)
        if found is not None:
            self.db.delete(found)
            self.db.commit()

    async def _api(self, token: str, method: str, path: str, body=None, query=None):
        """One call to the hub's REST API as the owner; the decoded reply, or ApiError."""
        url = f"http://127.0.0.1:{self.hub.port}{self.hub.base_url}api{path}"
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

    async def _listing(self, token: str, project: str) -> dict:
        where = f"/{quote(self.current_user.name)}/{quote(project)}"
        shares = await self._api(token, "GET", "/shares" + where)
        codes = await self._api(token, "GET", "/share-codes" + where)
        return {"shares": shares["items"], "codes": codes["items"]}

    def _hours(self) -> int:
        try:
            hours = int(self.get_body_argument("hours", str(self.default_hours)))
        except ValueError as e:
            raise ApiError(400, "Hours must be a whole number.") from e
        if not 1 <= hours <= self.max_hours:
            raise ApiError(400, f"A link lasts from 1 to {self.max_hours} hours.")
        return hours

    def _grant(self, project: str, kind: str, name: str) -> None:
        """Share with a user or group by name: what POST /hub/api/shares/... does, less its
        need of ``read:users:name`` (gpulab does not let users list each other)."""
        owner = self.current_user
        if not self.has_scope(f"shares!server={owner.name}/{project}"):
            raise ApiError(403, "You may not share this project.")
        if not name:
            raise ApiError(400, f"Name the {kind} to share with.")
        if kind == "user":
            target = orm.User.find(self.db, name)
            if target is not None and target.id == owner.orm_user.id:
                raise ApiError(400, "The project is yours already.")
        else:
            target = orm.Group.find(self.db, name)
        if target is None:
            raise ApiError(400, f"No such {kind}: {name}")
        # JupyterHub's default share: access to this one server.
        orm.Share.grant(self.db, owner.orm_spawners[project], target)

    async def _act(self, token: str, project: str) -> tuple[str, dict | None]:
        """Do the form's action; what to tell the owner, and the new link if one was made."""
        action = self.get_body_argument("action", "")
        name = self.get_body_argument("name", "").strip()
        where = f"/{quote(self.current_user.name)}/{quote(project)}"
        if action in ("user", "group"):
            self._grant(project, action, name)
            return f"Shared with {action} {name}.", None
        if action in ("revoke-user", "revoke-group"):
            kind = action.removeprefix("revoke-")
            await self._api(token, "PATCH", "/shares" + where, {kind: name})
            return f"Revoked the access of {kind} {name}.", None
        if action == "link":
            hours = self._hours()
            code = await self._api(
                token, "POST", "/share-codes" + where, {"expires_in": hours * 3600}
            )
            request = self.request
            code["full_accept_url"] = f"{request.protocol}://{request.host}{code['accept_url']}"
            return f"Link made; it works for {hours} h and only for logged-in users.", code
        if action == "revoke-link":
            await self._api(token, "DELETE", "/share-codes" + where, query={"id": name})
            return "Link revoked.", None
        raise ApiError(400, f"Unknown action {action!r}.")

    async def _page(self, project: str, status=200, message="", error="", new_link=None):
        token = self._token(project)
        try:
            listing = await self._listing(token, project)
        except ApiError as e:
            raise web.HTTPError(e.status, str(e)) from e
        finally:
            self._drop_token(token)
        html = await self.render_template(
            "gpulab-share.html",
            project=project,
            owner=self.current_user.name,
            project_url=self.current_user.server_url(project),
            message=message,
            error=error,
            new_link=new_link,
            max_hours=self.max_hours,
            default_hours=self.default_hours,
            **listing,
        )
        self.set_status(status)
        self.finish(html)

    @web.authenticated
    async def get(self, project: str):
        self._check_owner(project)
        await self._page(project)

    @web.authenticated
    async def post(self, project: str):
        self._check_owner(project)
        token = self._token(project)
        try:
            message, new_link = await self._act(token, project)
        except ApiError as e:
            await self._page(project, status=e.status, error=str(e))
            return
        finally:
            self._drop_token(token)
        await self._page(project, message=message, new_link=new_link)
