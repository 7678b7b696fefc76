"""``GET /hub/api/gpulab/secrets/<owner>/<project>``: the environment a person's new
kernels, terminals and jobs in a project get (project servers and the SSH gateway
ask; users never need it).

Asked with the person's own token (the project server passes on the token of the
request that starts the process; cookies are refused):

- the owner, with a token that may run code in the project (gpulab's ``execute``
  scope on it): ``{"env": {NAME: value}}`` for what the owner chose for the project;
- a collaborator: the same where the owner allowed collaborators, else ``{"env": {}}``;
- viewers, anyone without a share, and the project server's own token (which
  everyone who runs code in the container can read): 403; a project that does not
  exist: 404 (to those who could reach it; 403 to others).

``?for=<user>`` answers for ``user`` under the same rules, only for a token holding
``ssh.GATEWAY_SCOPE`` (gpulab's SSH gateway); any other token is refused it.
Values are never logged; every answer says ``Cache-Control: no-store``.
"""

from __future__ import annotations

import json

from jupyterhub import orm
from jupyterhub.apihandlers import APIHandler
from tornado import web

from gpulab_hub import blocking, hubsettings
from gpulab_hub.secrets import crypt
from gpulab_hub.secrets.store import SecretStore
from gpulab_hub.sharing import roles
from gpulab_hub.ssh import GATEWAY_SCOPE

SERVER_TOKEN_NOTE = "Server at "  # how JupyterHub notes a server's own token


class SecretsAPIHandler(APIHandler):
    def set_default_headers(self):
        super().set_default_headers()
        self.set_header("Cache-Control", "no-store")

    def _refuse(self, why: str):
        raise web.HTTPError(403, why)

    def _person(self, owner: str, project: str):
        """(person's orm.User, "owner" or "collaborator"), or 403/404."""
        if not getattr(self, "_token_authenticated", False):
            self._refuse("Ask with a token (Authorization: token …).")
        token = self.get_token()
        if token is not None and (token.note or "").startswith(SERVER_TOKEN_NOTE):
            self._refuse("A project server's own token cannot read anyone's secrets.")
        asked_for = self.get_query_argument("for", None)
        gateway = asked_for is not None
        if gateway and not self.has_scope(GATEWAY_SCOPE):
            self._refuse("Only gpulab's SSH gateway may ask for someone else.")
        server = f"server={owner}/{project}"
        if not gateway and not self.has_scope(f"access:servers!{server}"):
            self._refuse("You have no access to this project.")
        owner_row = orm.User.find(self.db, owner)
        spawner = owner_row.orm_spawners.get(project) if owner_row is not None else None
        if spawner is None or not project:
            raise web.HTTPError(404, f"No project {owner}/{project}.")
        if gateway:
            person = orm.User.find(self.db, asked_for)
        else:
            current = self.current_user
            person = getattr(current, "orm_user", None) if current is not None else None
        if person is None:
            self._refuse("You have no access to this project.")
        if person.id == owner_row.id:
            if not gateway and not self.has_scope(f"{roles.EXECUTE}!{server}"):
                self._refuse("This token may not run code in the project.")
            return person, "owner"
        if roles.role_on(self.db, person, spawner) != "collaborator":
            self._refuse("Only the project's owner and collaborators get its secrets.")
        return person, "collaborator"

    async def get(self, owner: str, project: str):
        person, role = self._person(owner, project)
        store = SecretStore(hubsettings.of_handler(self).db_url, owner, self.log)
        try:
            encrypted = await blocking.run(
                blocking.RECORDS, store.encrypted_for, project, role == "collaborator"
            )
        except store.Error as e:
            self.log.error("gpulab: secrets of %s: %s", owner, e)
            raise web.HTTPError(503, "The hub cannot read the secrets now.") from e
        env = {}
        unreadable = []
        try:
            for name, token in encrypted.items():
                value = await crypt.decrypt(token)
                if value is None:
                    unreadable.append(name)
                else:
                    env[name] = value
        except crypt.SecretsUnavailable as e:
            raise web.HTTPError(503, str(e)) from e
        if unreadable:
            self.log.warning(
                "gpulab: %s's secrets %s cannot be decrypted with the hub's key (changed "
                "without keeping the old one?); %s must set them again",
                owner, ", ".join(unreadable), owner,
            )  # fmt: skip
        self.log.info(
            "gpulab: %s/%s gives %s (%s) the secrets %s",
            owner, project, person.name, role, ", ".join(sorted(env)) or "-",
        )  # fmt: skip
        self.finish(json.dumps({"env": env}))
