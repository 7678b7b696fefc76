"""The hub's answer to the SSH gateway: may this user open a shell in that project?

``GET /hub/api/gpulab/ssh/access/<user>/<owner>/<project>``, only for a token that
holds ``GATEWAY_SCOPE`` (the gateway service's: ssh/__init__.py gives it the role);
every other token, a user's or an admin's, gets 403. The answer (200, JSON)::

    {"user", "owner", "project",
     "role": "owner" | "collaborator" | "viewer" | "",
     "exists": bool, "running": bool, "pending": null | "spawn" | "stop",
     "can_start": bool, "container": "<container name>" | "",
     "exec_user": "<uid>:<gid>", "workdir": "<folder in the container>",
     "url": "<path of the project's JupyterLab>", "prefix": "<container prefix>",
     "message": "<why not, in the user's words; '' when a shell is allowed>"}

The role is the project's owner, or the person's share role (their own share or one of
their groups', sharing/roles.py); "" for anyone else, for a user who does not exist or
whose account is not approved, and for a project that does not exist: those get the
same answer and message, so the gateway cannot tell whether someone else has a project
of that name. A viewer gets their role and a message (viewers never get a shell) but
no container. ``can_start``: the owner, or a collaborator whose owner allows
collaborators to start the project (the rule of the "Shared with me" page).
"""

from __future__ import annotations

import json

from jupyterhub import orm
from jupyterhub.apihandlers.base import APIHandler
from tornado import web

from gpulab_hub import blocking, hubsettings
from gpulab_hub.sharing import roles
from gpulab_hub.sharing.received import policy_store
from gpulab_hub.ssh import GATEWAY_SCOPE, names

SHELL_ROLES = ("owner", "collaborator")


def not_found(user: str, owner: str, project: str) -> str:
    """The one refusal for a project that is not there for ``user``, whatever the reason."""
    if user == owner:
        return f"You have no project {project}."
    return f"{owner} has no project {project} shared with you."


def viewer_message(owner: str, project: str) -> str:
    return (
        f"You are a viewer of {owner}'s project {project}: viewers cannot open a shell. "
        f"Ask {owner} to make you a collaborator."
    )


def _approved(db, name: str, authenticator=None) -> orm.User | None:
    """The hub's user of an approved account ``name``; None otherwise (with the lab's
    own logins, every user the hub has)."""
    from nativeauthenticator.orm import UserInfo

    from gpulab_hub.accounts import providers

    user = orm.User.find(db, name)
    if authenticator is not None and not providers.is_local(authenticator):
        return user
    info = UserInfo.find(db, name) if user is not None else None
    return user if info is not None and info.is_authorized else None


def role_of(db, person: orm.User | None, owner: orm.User | None, spawner) -> str:
    """``person``'s role on ``owner``'s project ``spawner`` (orm), "" for none."""
    if person is None or owner is None or spawner is None:
        return ""
    if person.id == owner.id:
        return "owner"
    role = roles.role_on(db, person, spawner)
    return role if role in ("collaborator", "viewer") else ""


class AccessHandler(APIHandler):
    """GET /hub/api/gpulab/ssh/access/<user>/<owner>/<project> (see the module's doc)."""

    async def get(self, user: str, owner: str, project: str):
        if self.current_user is None or not self.has_scope(GATEWAY_SCOPE):
            raise web.HTTPError(403, "Only gpulab's SSH gateway may ask this.")
        # Whole names only, as the gateway parsed them from a login name.
        if names.parse_login(names.login_name(user, owner, project)) != names.Login(
            user, owner, project
        ):
            raise web.HTTPError(400, "Not a user, owner and project of a login name.")
        reply = await self.answer(user, owner, project)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.write(json.dumps(reply))

    async def answer(self, user: str, owner: str, project: str) -> dict:
        where = hubsettings.of_handler(self)
        reply = {
            "user": user,
            "owner": owner,
            "project": project,
            "role": "",
            "exists": False,
            "running": False,
            "pending": None,
            "can_start": False,
            "container": "",
            "exec_user": "",
            "workdir": "",
            "url": "",
            "prefix": where.prefix,
            "message": not_found(user, owner, project),
        }
        person = _approved(self.db, user, self.authenticator)
        owner_orm = person if owner == user else orm.User.find(self.db, owner)
        orm_spawner = owner_orm.orm_spawners.get(project) if owner_orm is not None else None
        role = role_of(self.db, person, owner_orm, orm_spawner)
        if not role:
            return reply
        hub_owner = self.users[owner_orm]
        spawner = hub_owner.spawners[project]
        pending = spawner.pending if spawner.pending in ("spawn", "stop") else None
        reply.update(
            role=role,
            exists=True,
            running=bool(spawner.ready),
            pending=pending,
            url=hub_owner.server_url(project) + "lab",
            message="",
        )
        if role == "viewer":
            reply["message"] = viewer_message(owner, project)
            return reply
        if role == "owner":
            reply["can_start"] = True
        else:  # the sharing settings: the database, read off the event loop
            policies = policy_store(where.db_url)
            settings = await blocking.run(blocking.RECORDS, policies.get, owner, project)
            reply["can_start"] = settings.collaborators_may_start
        reply.update(
            container=spawner.container_name,
            exec_user=f"{spawner.notebook_uid}:{spawner.notebook_gid}",
            workdir=spawner.workspace_dir,
        )
        return reply
