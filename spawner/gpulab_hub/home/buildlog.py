"""The hub page of a project's latest build log: /hub/gpulab/build-log/<project>, and
/hub/gpulab/build-log/<owner>/<project> (also the owner's; the form the failure page and
the project's GPULAB_BUILD_LOG_URL link to).

Build logs live in the hub's own state folder (images/project.py), out of the project
user's reach. This page shows the newest one to the project's owner and to people it is
shared with as collaborators (directly or through a group), who can change its
Dockerfile; never to viewers, other users or admins without a share (404, as for a
project that does not exist). It reads at most images.project.MAX_LOG_SHOWN bytes from
the end of the log, without ANSI escape codes, escaped in the page.
"""

from __future__ import annotations

import time
from urllib.parse import quote

from jupyterhub import orm
from jupyterhub.handlers import BaseHandler
from tornado import web

from gpulab_hub import blocking, hubsettings
from gpulab_hub.images import project as projectimage
from gpulab_hub.projects import Project, project_name
from gpulab_hub.sharing import roles

PAGE = "/gpulab/build-log"


def page_url(hub_base_url: str, owner: str, project: str) -> str:
    """The page's path for ``owner``'s ``project``, from the hub's base URL ("/hub/")."""
    return f"{hub_base_url.rstrip('/')}{PAGE}/{quote(owner, safe='')}/{quote(project, safe='')}"


def _read(project: Project):
    """Blocking (a worker thread): the latest log's path, its text, whether it was cut,
    and whether the last build failed."""
    path = projectimage.latest_log(project)
    text, cut = projectimage.read_log(path) if path is not None else ("", False)
    return path, text, cut, projectimage.last_build_failed(project)


class BuildLogHandler(BaseHandler):
    """GET: the latest build log of a project its owner or a collaborator may change."""

    def _target(self, first: str, second: str | None) -> tuple[str, str]:
        """(owner, project) of the request, or 404."""
        me = self.current_user
        if second is None or first == me.name:
            project = first if second is None else second
            if project not in me.orm_spawners:
                raise web.HTTPError(404, f"You have no project named {project!r}.")
            return me.name, project
        owner = orm.User.find(self.db, first)
        spawner = owner.orm_spawners.get(second) if owner is not None else None
        if spawner is None or roles.role_on(self.db, me.orm_user, spawner) != "collaborator":
            raise web.HTTPError(404, f"No project {first}/{second} is shared with you.")
        return first, second

    @web.authenticated
    async def get(self, first: str, second: str | None = None):
        owner, name = self._target(first, second)
        where = hubsettings.of_handler(self)
        project = Project(where.projects_root, owner, project_name(name), where.state_root)
        path, text, cut, build_failed = await blocking.run(blocking.RECORDS, _read, project)
        written = ""
        if path is not None:
            stamp = path.name.removeprefix("build-").removesuffix(".log")
            written = time.strftime("%Y-%m-%d %H:%M:%S", time.strptime(stamp, "%Y%m%d-%H%M%S"))
        mine = owner == self.current_user.name
        html = await self.render_template(
            "gpulab-build-log.html",
            owner=owner,
            project=name,
            mine=mine,
            log_text=text,
            has_log=path is not None,
            cut=cut,
            shown_kib=projectimage.MAX_LOG_SHOWN >> 10,
            written=written,
            build_failed=build_failed,
            spawn_url=f"{self.hub.base_url}spawn/{quote(owner, safe='')}/{quote(name, safe='')}",
        )
        self.finish(html)


def hub_handlers() -> list[tuple]:
    """JupyterHub ``extra_handlers`` of the build log page (hubconfig.py adds them)."""
    return [(PAGE + r"/([^/]+)(?:/([^/]+))?", "gpulab_hub.home.buildlog.BuildLogHandler")]
