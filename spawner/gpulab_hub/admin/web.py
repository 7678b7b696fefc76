"""The handler of /hub/gpulab/admin (see the package docstring): GET shows, POST acts.

What JupyterHub keeps in memory and in its database (users, servers, starts under
way) is read on the event loop, as JupyterHub's own pages read it; the records on
disk (GPU holdings, the GPU queue) on the records pool, and the disk walk on a
thread of its own (facts.py).
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field

from jupyterhub import orm
from jupyterhub.handlers import BaseHandler
from jupyterhub.slugs import is_valid_safe_slug
from tornado import web

from gpulab_hub import blocking, hubsettings
from gpulab_hub.accounts import USERNAME_PATTERN
from gpulab_hub.admin import facts, userdelete
from gpulab_hub.home import facts as home_facts
from gpulab_hub.images import prebuild
from gpulab_hub.sharing.received import server_state

ACTIONS = ("stop", "delete", "approve", "delete-user")
STOP_WAIT_S = 60.0  # how long an action waits for a project to stop
BUILDING = (
    "Building image",
    "Waiting for a build slot",
    "Waiting for your other image build",
    "Your other image build",  # the quick lane's first words (images/builds.py)
)
REFUSED = "Only admins may see the admin overview and use its actions."


@dataclass(frozen=True)
class ProjectRow:
    owner: str
    name: str
    display_name: str
    state: str  # running, starting, waiting for a GPU, stopping, stopped, failed
    since: str  # when it started (running or starting); "" otherwise
    last_activity: str
    gpus: tuple[facts.Holding, ...]
    cpu_only_host: bool

    @property
    def active(self) -> bool:
        return self.state not in ("stopped", "failed")

    @property
    def gpu_words(self) -> str:
        if self.gpus:
            return "; ".join(f"{h.label} since {h.since_iso}" for h in self.gpus)
        if self.cpu_only_host and self.active:
            return "no GPU (this host has none)"
        return "no GPU"


@dataclass(frozen=True)
class BuildRow:
    owner: str
    project: str
    words: str  # the start's latest build message
    since: str


@dataclass
class UserRow:
    name: str
    admin: bool
    last_activity: str
    projects: int = 0
    running: int = 0
    gpus: int = 0
    disk: facts.Disk | None = None
    groups: list[str] = field(default_factory=list)


def _when(dt) -> str:
    return dt.strftime("%Y-%m-%d %H:%M UTC") if dt else ""


def _state(spawner, orm_spawner, queued: bool) -> str:
    if spawner is None:  # never made since the hub started: JupyterHub knows its server
        return "running" if orm_spawner.server is not None else "stopped"
    state = server_state(spawner)
    if state == "starting" and queued:
        return "waiting for a GPU"
    return state


def _build_words(spawner) -> str:
    """The start's latest build message, where it builds (or waits to build) an image."""
    if spawner is None or spawner.pending != "spawn":
        return ""
    for event in reversed(getattr(spawner, "_progress_events", None) or []):
        message = str(event.get("message", ""))
        if message.startswith(BUILDING):
            return message[:300]
        if message:
            return ""  # its latest step is past the build (or before it)
    return ""


class AdminHandler(BaseHandler):
    """/hub/gpulab/admin: the overview (GET) and its actions (POST ``action=...``)."""

    def _check_admin(self) -> None:
        if not self.current_user.admin:
            raise web.HTTPError(403, REFUSED)

    def _native(self) -> bool:
        from nativeauthenticator import NativeAuthenticator

        return isinstance(self.authenticator, NativeAuthenticator)

    def _waiting_accounts(self) -> list[str]:
        if not self._native():
            return []
        from nativeauthenticator.orm import UserInfo

        rows = self.db.query(UserInfo).filter(UserInfo.is_authorized.is_(False))
        return sorted(i.username for i in rows.order_by(UserInfo.username).limit(500))

    async def _page(
        self, status: int = 200, said: str = "", error: str = "", confirm=None, confirm_user=None
    ):
        where = hubsettings.of_handler(self)
        records = await blocking.run(blocking.RECORDS, facts.records, where)
        queued = {(q.owner, q.project) for q in records.queued}
        cpu_only = not records.holdings and not await blocking.run(blocking.RECORDS, _has_devices)
        users, projects, builds = [], [], []
        for orm_user in self.db.query(orm.User).order_by(orm.User.name):
            user = self.users[orm_user]
            row = UserRow(
                orm_user.name,
                bool(orm_user.admin),
                _when(orm_user.last_activity),
                groups=sorted(g.name for g in orm_user.groups),
            )
            for name, orm_spawner in sorted(orm_user.orm_spawners.items()):
                if not name:
                    continue  # gpulab has no default project
                spawner = user.spawners.get(name)
                state = _state(spawner, orm_spawner, (orm_user.name, name) in queued)
                held = tuple(records.held_by(orm_user.name, name))
                active = state not in ("stopped", "failed")
                projects.append(
                    ProjectRow(
                        owner=orm_user.name,
                        name=name,
                        display_name=(spawner.display_name if spawner else "") or name,
                        state=state,
                        since=_when(orm_spawner.started) if active else "",
                        last_activity=_when(orm_spawner.last_activity),
                        gpus=held,
                        cpu_only_host=cpu_only,
                    )
                )
                row.projects += 1
                row.running += state == "running"
                row.gpus += len(held)
                words = _build_words(spawner)
                if words:
                    builds.append(BuildRow(orm_user.name, name, words, _when(orm_spawner.started)))
            users.append(row)
        disks = await asyncio.to_thread(
            facts.disk_cache().used, where.projects_root, [u.name for u in users]
        )
        for row in users:
            row.disk = disks.get(row.name)
        waiting = self._waiting_accounts()
        self.set_status(status)
        html = await self.render_template(
            "gpulab-admin.html",
            users=users,
            waiting=waiting,
            native=self._native(),
            projects=projects,
            records=records,
            builds=builds,
            starting_points=prebuild.states(),
            cpu_only=cpu_only,
            said=said,
            error=error,
            confirm=confirm,
            confirm_user=confirm_user,
            projects_root=str(where.projects_root),
            cache_s=int(facts.CACHE_S),
        )
        self.finish(html)

    @web.authenticated
    async def get(self):
        self._check_admin()
        await self._page()

    # --- actions ---

    def _project(self):
        """The (user, server name) the form names; 404 where there is no such project."""
        owner = self.get_body_argument("owner", "")
        name = self.get_body_argument("project", "")
        if not re.fullmatch(USERNAME_PATTERN, owner) or not is_valid_safe_slug(name):
            raise web.HTTPError(400, "Choose a project from the page's list.")
        user = self.find_user(owner)
        if user is None or name not in user.orm_spawners:
            raise web.HTTPError(404, f"{owner} has no project named \u201c{name}\u201d.")
        return user, name

    async def _stop(self, user, name: str) -> str:
        """Stop the project as JupyterHub's REST API does (a start under way is
        cancelled); the stop's future, or None where nothing runs."""
        spawner = user.spawners[name]
        if spawner.pending == "stop":
            return "stopping"
        if spawner.pending == "spawn":
            if spawner._spawn_future is not None:
                spawner._spawn_future.cancel()
            await asyncio.sleep(1)  # as JupyterHub's API: let the cancelled start unwind
        elif not spawner.active:
            return "stopped already"
        try:
            future = await self.stop_single_user(user, name)
        except RuntimeError:
            return "busy"
        try:  # JupyterHub waited slow_stop_timeout; a container may take a little longer
            await asyncio.wait_for(asyncio.shield(future), STOP_WAIT_S)
        except TimeoutError:
            return "stopping"
        except Exception as e:  # noqa: BLE001 - the hub logged it; the admin is told
            self.log.warning("gpulab: the admin's stop of %s/%s failed: %s", user.name, name, e)
            return "failed"
        return "stopped" if not spawner.active else "stopping"

    async def _act_stop(self, user, name: str) -> str:
        # A user's name is never capitalised: sentences do not start with it.
        what = f"{user.name}'s project \u201c{name}\u201d"
        done = await self._stop(user, name)
        if done == "stopped":
            return f"Stopped {what}; the GPUs it held are free."
        if done == "stopped already":
            return f"Nothing to stop: {what} was not running."
        if done == "failed":
            return f"Could not stop {what}: the hub's log says why."
        if done == "busy":
            return f"Try again in a moment: {what} is between two states."
        return f"Stopping {what}: reload this page in a moment to see it stopped."

    async def _act_delete(self, user, name: str) -> str | None:
        """JupyterHub's removal of a named server (stopped first), which runs gpulab's
        deletion workflow (ProjectSpawner.delete_forever); None: asked to confirm."""
        what = f"{user.name}'s project \u201c{name}\u201d"
        if self.get_body_argument("confirm", "") != "yes":
            return None
        spawner = user.spawners[name]
        if spawner.active:
            await self._stop(user, name)
            if spawner.active:
                return f"Not deleted yet: {what} is still stopping; delete it once it has."
        self.log.info("gpulab: %s deletes %s/%s", self.current_user.name, user.name, name)
        await user._delete_spawner(spawner)  # ProjectSpawner.delete_forever: deletion.py
        self.db.delete(spawner.orm_spawner)
        user.spawners.pop(name, None)
        self.db.commit()
        facts.disk_cache().forget(user.name)
        where = hubsettings.of_handler(self)
        archived = await blocking.run(
            blocking.RECORDS, home_facts.archived_as, where, user.name, name
        )
        if archived:
            return (
                f"Deleted {what}. Its files were moved to the hub's archive as {archived}; "
                "you can restore them from there."
            )
        return f"Deleted {what} and its files."

    def _act_approve(self) -> str:
        from nativeauthenticator.orm import UserInfo

        from gpulab_hub.accounts import set_approval

        name = self.get_body_argument("name", "")
        if not self._native() or not re.fullmatch(USERNAME_PATTERN, name):
            raise web.HTTPError(400, "Choose an account from the page's list.")
        info = UserInfo.find(self.db, name)
        if info is None:
            raise web.HTTPError(404, f"No account named \u201c{name}\u201d.")
        if info.is_authorized:
            return f"The account \u201c{name}\u201d was approved already."
        set_approval(self, info, True)
        return f"Approved the account \u201c{name}\u201d: they can log in now."

    async def _act_delete_user(self) -> tuple[str, dict | None]:
        """Delete a user and all their projects, once the admin typed the user's name
        (as deleting one project asks for its name); else the question, with the user's
        projects (what goes with the account)."""
        name = self.get_body_argument("name", "")
        if not re.fullmatch(USERNAME_PATTERN, name):
            raise web.HTTPError(400, "Choose a user from the page's list.")
        user = self.find_user(name)
        if user is None:
            raise web.HTTPError(404, f"No user named \u201c{name}\u201d.")
        if user.name == self.current_user.name:
            return "You cannot delete your own account.", None
        question = {"name": user.name, "projects": sorted(n for n in user.orm_spawners if n)}
        typed = self.get_body_argument("confirm_name", None)
        if typed is None:
            return "", question
        if typed.strip() != user.name:
            question["mistyped"] = True
            return "", question
        self.log.info("gpulab: %s deletes the user %s", self.current_user.name, user.name)
        await userdelete.delete_user(self, user)
        facts.disk_cache().forget(name)
        count = len(question["projects"])
        return (
            f"Deleted the user {name} and their {count} project{'s' if count != 1 else ''}.",
            None,
        )

    @web.authenticated
    async def post(self):
        self._check_admin()
        action = self.get_body_argument("action", "")
        if action not in ACTIONS:
            raise web.HTTPError(400, "Unknown action: use the page's buttons.")
        if action == "approve":
            await self._page(said=self._act_approve())
            return
        if action == "delete-user":
            said, question = await self._act_delete_user()
            await self._page(said=said, confirm_user=question)
            return
        user, name = self._project()
        if action == "stop":
            await self._page(said=await self._act_stop(user, name))
            return
        said = await self._act_delete(user, name)
        if said is None:
            await self._page(confirm={"owner": user.name, "project": name})
            return
        await self._page(said=said)


def _has_devices() -> bool:
    """Blocking: whether this host has a GPU gpulab can hand out (NVML, cached)."""
    try:
        return bool(facts.device_labels())
    except Exception:  # noqa: BLE001 - no NVML, no driver: no GPU to show
        return False
