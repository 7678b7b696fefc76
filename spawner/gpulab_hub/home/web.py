"""The home page's handlers, and the routes of JupyterHub's default server that lead
there instead (see the package docstring)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlencode

from jupyterhub.handlers import BaseHandler
from jupyterhub.handlers.base import UserUrlHandler as HubUserUrlHandler
from jupyterhub.slugs import is_valid_safe_slug
from jupyterhub.utils import get_accepted_mimetype
from tornado import web

from gpulab_hub import blocking, hubsettings
from gpulab_hub.home import PAGE, facts
from gpulab_hub.projects import stacks
from gpulab_hub.sharing.received import policies_now, policy_store, received_rows, server_state
from gpulab_hub.workflows.deletion import GpulabDeletion

# ?notice=<key> on the home page: fixed words, never text from the address.
NOTICES = {
    "no-default": (
        "That address is for a default project, which gpulab does not have: every "
        "project has a name of its own. Open one of your projects below, or create one."
    ),
}


@dataclass(frozen=True)
class Row:
    """One of the user's projects, as the home page shows it."""

    name: str
    display_name: str
    state: str  # received.server_state()
    failure: str  # why the last start failed ("" unless state is "failed")
    url: str
    facts: facts.Facts
    waiting: str = ""  # where its start stands in the GPU queue ("2 ahead; GPU 1 is ...")


WAITING = "waiting for a GPU: "


def _waiting(spawner) -> str:
    """The spawn page's latest GPU-queue words of a pending start, without their head."""
    if not getattr(spawner, "pending", None):
        return ""
    for event in reversed(getattr(spawner, "_progress_events", None) or []):
        message = str(event.get("message", ""))
        if message.startswith(WAITING):
            return message[len(WAITING) :][:400]
    return ""


def _failure(spawner) -> str:
    future = getattr(spawner, "_spawn_future", None)
    error = future.exception() if future is not None and future.done() else None
    return str(error or "")[:300]


def home_url(handler, **query) -> str:
    url = handler.hub.base_url + PAGE.lstrip("/")
    return url + ("?" + urlencode(query) if query else "")


class HomeHandler(BaseHandler):
    """/hub/home: gpulab's home page."""

    def _rows(self, user, found: dict[str, facts.Facts]) -> list[Row]:
        rows = []
        for name in sorted(found):
            spawner = user.spawners[name]
            state = server_state(spawner)
            rows.append(
                Row(
                    name=name,
                    display_name=spawner.display_name or name,
                    state=state,
                    failure=_failure(spawner) if state == "failed" else "",
                    url=user.server_url(name),
                    facts=found[name],
                    waiting=_waiting(spawner) if found[name].gpu_waiting else "",
                )
            )
        return rows

    def _notices(self, user, deleted: str, archived_as: str) -> list[str]:
        said = [NOTICES[k] for k in self.get_query_arguments("notice") if k in NOTICES]
        missing = self.get_query_argument("missing", "")
        if is_valid_safe_slug(missing) and missing not in user.orm_user.orm_spawners:
            said.append(
                f"You have no project named \u201c{missing}\u201d (was it renamed or deleted?)."
            )
        if deleted:
            if archived_as:
                said.append(
                    f"Deleted the project \u201c{deleted}\u201d. Its files (notebooks, Dockerfile, "
                    f"build logs) were moved to the hub's archive as {archived_as}; an "
                    "administrator can restore them from there. A new project of that name "
                    "starts empty."
                )
            else:
                said.append(
                    f"Deleted the project \u201c{deleted}\u201d and its files. A new project "
                    "of that name starts empty."
                )
        return said

    @web.authenticated
    async def get(self):
        user = self.current_user
        where = hubsettings.of_handler(self)
        names = [n for n in user.orm_user.orm_spawners if n]
        deleted = self.get_query_argument("deleted", "")
        if not is_valid_safe_slug(deleted) or deleted in names:
            deleted = ""
        running = tuple(n for n in names if user.spawners[n].ready) if names else ()
        found = await blocking.run(
            blocking.RECORDS, facts.projects, where, user.name, names, running
        )
        archived_as = ""
        if deleted:
            archived_as = await blocking.run(
                blocking.RECORDS, facts.archived_as, where, user.name, deleted
            )
        groups = [g.name for g in user.orm_user.groups]
        gpu_use = await blocking.run(blocking.RECORDS, facts.gpu_use, where, user.name, groups)
        rows = self._rows(user, found)
        shared = received_rows(self, await policies_now(policy_store(where.db_url)))
        html = await self.render_template(
            "home.html",
            user=user,
            rows=rows,
            gpu_use=gpu_use,
            shared=shared,
            notices=self._notices(user, deleted, archived_as),
            limit=await self.get_current_user_named_server_limit(),
            archive=GpulabDeletion(config=self.settings["config"]).archive,
            stacks=stacks.STACKS,
            refresh=any(r.state in ("starting", "stopping") for r in [*rows, *shared]),
        )
        self.finish(html)


class NoDefaultProjectHandler(BaseHandler):
    """/hub/spawn and /hub/spawn/<user>: JupyterHub's default server, which gpulab has
    not; the user is sent home with a word (nothing is started or created)."""

    @web.authenticated
    def get(self, user_name: str | None = None):
        self.redirect(home_url(self, notice="no-default"))

    @web.authenticated
    def post(self, user_name: str | None = None):
        self.redirect(home_url(self, notice="no-default"), status=303)


class UserUrlHandler(HubUserUrlHandler):
    """/hub/user/<user>/...: JupyterHub's, except for the user's own default server
    that is not running (an address of no project of theirs): home, with a word."""

    async def get(self, user_name, user_path):
        user = self.current_user
        path = (user_path or "/").lstrip("/")
        first, _, rest = path.partition("/")
        wants_json = get_accepted_mimetype(
            self.request.headers.get("Accept", ""), choices=["application/json", "text/html"]
        ) == "application/json" or "api" in path.split("/")
        default = dict.get(user.spawners, "") if user is not None else None
        if (
            user is None
            or user_name != user.name
            or (first and first in user.orm_user.orm_spawners)  # a project of theirs
            or (default is not None and default.active)
            or wants_json
        ):
            await super().get(user_name, user_path)
            return
        query = {"notice": "no-default"}
        if rest or path.endswith("/"):  # /user/<me>/<name>/...: it names a project
            if is_valid_safe_slug(first):
                query = {"missing": first}
        self.redirect(home_url(self, **query))
