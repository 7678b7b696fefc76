"""The hub page /hub/gpulab/shared: projects shared with the logged-in user.

Lists JupyterHub's shares of the user (``orm.User.all_shared_with_me``: shared
with them directly or with one of their groups): owner, project, role, whether
the owner's server runs, an Open link. The user can **leave** a share made to
them directly (JupyterHub's own self-revocation, ``Share`` deleted); a share made
to a group is the group's, and only the owner (or an admin, by removing them
from the group) ends it. A **collaborator** may **start** the owner's stopped
server when the owner allowed it (``collaborators_may_start`` in the owner's
sharing policy, sharing/policy.py): shares cannot carry ``servers`` scopes, so the
check is made here and the hub starts the server as JupyterHub's admin spawn does,
with the options the owner last started it with.
"""

from __future__ import annotations

from dataclasses import dataclass

from jupyterhub import orm
from jupyterhub.handlers import BaseHandler
from jupyterhub.slugs import is_valid_safe_slug
from tornado import web

from gpulab_hub import blocking, hubsettings
from gpulab_hub.sharing import roles
from gpulab_hub.sharing.policy import ProjectSharing, SharingPolicyStore

PAGE = "/gpulab/shared"


@dataclass
class Received:
    owner: str
    project: str
    role: str
    via: str  # "" for a share to the user, else the group's name
    since: str  # ISO 8601, UTC
    expires: str  # ISO 8601, UTC; "" for never
    state: str  # server_state()
    url: str
    may_start: bool


def policy_store(db_url: str) -> SharingPolicyStore:
    """The sharing settings in the hub's database ``db_url`` (its Layout's)."""
    return SharingPolicyStore(db_url)


def server_state(spawner) -> str:
    """A JupyterHub server's state, in gpulab's words: "running", "starting",
    "stopping", "failed" (its last start failed) or "stopped"."""
    if spawner.ready:
        return "running"
    if spawner.pending == "stop":
        return "stopping"
    if spawner.pending:
        return "starting"
    if spawner._failed:
        return "failed"
    return "stopped"


def iso_utc(when) -> str:
    """A naive UTC datetime of JupyterHub's database as ISO 8601 ("...Z"); "" for None."""
    return when.strftime("%Y-%m-%dT%H:%M:%SZ") if when else ""


async def policies_now(store: SharingPolicyStore) -> dict[str, ProjectSharing]:
    """The sharing settings of every project, read on the records pool (the database:
    never on the event loop)."""
    return await blocking.run(blocking.RECORDS, store.snapshot)


def received_rows(handler, policies: dict[str, ProjectSharing]) -> list[Received]:
    """What is shared with the handler's user (its own shares and its groups');
    ``policies``: ``policies_now()``."""
    rows = []
    for share in handler.current_user.orm_user.all_shared_with_me:
        if share.owner is None or share.spawner is None:
            continue
        owner, project = share.owner.name, share.spawner.name
        role = roles.role_of(share.scopes)
        hub_owner = handler.users[share.owner]
        rows.append(
            Received(
                owner=owner,
                project=project,
                role=role,
                via=share.group.name if share.group is not None else "",
                since=iso_utc(share.created_at),
                expires=iso_utc(getattr(share, "expires_at", None)),
                state=server_state(hub_owner.spawners[project]),
                url=hub_owner.server_url(project),
                may_start=role == "collaborator"
                and policies.get(f"{owner}/{project}", ProjectSharing()).collaborators_may_start,
            )
        )
    rows.sort(key=lambda r: (r.owner, r.project, r.via))
    return rows


class SharedWithMeHandler(BaseHandler):
    def initialize(self, **_):
        self.policies = policy_store(hubsettings.of_handler(self).db_url)

    async def _page(self, status=200, message="", error=""):
        rows = received_rows(self, await policies_now(self.policies))
        html = await self.render_template(
            "gpulab-shared.html",
            rows=rows,
            message=message,
            error=error,
            refresh=any(r.state in ("starting", "stopping") for r in rows),
        )
        self.set_status(status)
        self.finish(html)

    @web.authenticated
    async def get(self):
        await self._page()

    def _spawner(self, owner: str, project: str) -> orm.Spawner:
        found = self.find_user(owner) if owner else None
        if found is None or not is_valid_safe_slug(project or ""):
            raise web.HTTPError(404, "Nothing of that name is shared with you.")
        spawner = found.orm_user.orm_spawners.get(project)
        if spawner is None:
            raise web.HTTPError(404, "Nothing of that name is shared with you.")
        return spawner

    def _shares(self, spawner: orm.Spawner) -> list[orm.Share]:
        me = self.current_user.orm_user
        return [s for s in me.all_shared_with_me if s.spawner_id == spawner.id]

    def _leave(self, owner: str, project: str) -> str:
        spawner = self._spawner(owner, project)
        share = orm.Share.find(self.db, spawner, self.current_user.orm_user)
        if share is None:
            groups = [s.group.name for s in self._shares(spawner) if s.group is not None]
            if groups:
                raise web.HTTPError(
                    400,
                    f"{owner} shared {project} with your group {', '.join(groups)}: you cannot "
                    "leave a group's share; ask the owner or an admin.",
                )
            raise web.HTTPError(404, "Nothing of that name is shared with you.")
        self.db.delete(share)
        self.db.commit()
        self.log.info("gpulab: %s left the share of %s/%s", self.current_user.name, owner, project)
        return f"You left {owner}'s project {project}."

    async def _start(self, owner: str, project: str) -> str:
        spawner = self._spawner(owner, project)
        shares = self._shares(spawner)
        if not shares:
            raise web.HTTPError(404, "Nothing of that name is shared with you.")
        if not any(roles.role_of(s.scopes) == "collaborator" for s in shares):
            raise web.HTTPError(403, f"Only collaborators may start {owner}'s project.")
        policy = (await policies_now(self.policies)).get(f"{owner}/{project}", ProjectSharing())
        if not policy.collaborators_may_start:
            raise web.HTTPError(
                403, f"{owner} has not allowed collaborators to start {project}; ask {owner}."
            )
        user = self.users[spawner.user]
        running = user.spawners[project]
        if running.ready or running.pending:
            return f"{owner}'s project {project} is running or starting already."
        self.log.info(
            "gpulab: collaborator %s starts %s/%s", self.current_user.name, owner, project
        )
        # Returns when it runs, or after JupyterHub's slow-spawn wait while it goes on.
        await self.spawn_single_user(user, project)
        if running.ready:
            return f"{owner}'s project {project} is running."
        return f"Starting {owner}'s project {project}: this page shows when it runs."

    @web.authenticated
    async def post(self):
        action = self.get_body_argument("action", "")
        owner = self.get_body_argument("owner", "")
        project = self.get_body_argument("project", "")
        try:
            if action == "leave":
                message = self._leave(owner, project)
            elif action == "start":
                message = await self._start(owner, project)
            else:
                raise web.HTTPError(400, f"Unknown action {action!r}.")
        except web.HTTPError as e:
            await self._page(status=e.status_code, error=e.log_message or "Refused.")
            return
        await self._page(message=message)
