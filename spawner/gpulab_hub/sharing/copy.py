"""Save a copy: a notebook someone may read, copied into one of their own projects.

GET /hub/gpulab/copy?owner=alice&project=one&path=nb/x.ipynb says which notebook
from whom, and offers the user's own projects (or a new one); POST copies it to
the top of the chosen project as ``x (copy).ipynb`` (``x (copy 2).ipynb``, ...)
and sends the user to it in JupyterLab. ``?public=<code>`` names the notebook of a
public link instead (sharing/public.py): the code grants reading that one file.

The packages installed with ``%gpu_install`` in the source project (its
Dockerfile's managed block) are offered too, one box per line, each line shown
whole as it would land in the chosen project's Dockerfile: only plain lines
(``name==version`` from the default index, no option) are ticked; lines with
options are left for the person to tick; lines with options outside the
allow-list are shown as refused, with the reason (installs.py). The POST is
checked against the lines read afresh: a line refused, not offered or changed
since is refused (400) and nothing is copied. Brought along, the ticked lines
are written into the managed block of the chosen project's Dockerfile, and the
page then says what was brought and that the project must be (re)started to
build them; left behind, it says the copy's imports may fail. A public link
grants one notebook only: nothing of its project's Dockerfile is read for it.

Who may read: the project's owner, or someone it is shared with as viewer or
collaborator (gpulab's ``custom:gpulab:read`` scope or one that includes it, on
that server). A share with ``access:servers`` only (phase 1, before roles) does
not count: the project server's authorizer refuses it too.

Paths are untrusted and files are read without following links (notebooks.py);
the copy is created exclusively through safefs.py.
"""

from __future__ import annotations

import os
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlencode

from jupyterhub.handlers import BaseHandler
from jupyterhub.slugs import safe_slug
from tornado import web

from gpulab_hub import blocking, hubsettings
from gpulab_hub.projects import (
    DEFAULT_PROJECT,
    Project,
    ProjectError,
    options,
    project_name,
    safefs,
)
from gpulab_hub.sharing import installs, roles
from gpulab_hub.sharing.notebooks import (
    NOTEBOOK,
    FileRefused,
    check_path,
    check_project,
    open_project_dir,
    read_notebook,
)
from gpulab_hub.sharing.public import find_link

_COPY_TRIES = 100


def new_project_names(typed: str) -> tuple[str, str]:
    """(display name, project name) of a new project from what a person typed, as the
    home page makes them (JupyterHub's ``sanitise_display_name`` and ``safe_slug``):
    "Bob Copy" -> ("Bob Copy", "bob-copy"). FileRefused for a name that gives none."""
    text = unicodedata.normalize("NFC", typed)
    kept = "".join(ch for ch in text if ch == " " or unicodedata.category(ch)[0] in "LMNPS")
    display = re.sub(" {2,}", " ", kept).strip()
    if not display:
        raise FileRefused(400, "Give the new project a name (letters or digits).")
    try:
        display = options.check_display_name(display)
        name = project_name(safe_slug(display, avoid_collisions=False))
    except (options.OptionsError, ProjectError, ValueError) as e:
        raise FileRefused(400, str(e)) from e
    if name == DEFAULT_PROJECT:
        raise FileRefused(
            400, f"\u201c{name}\u201d is a name gpulab keeps for itself: choose another."
        )
    return display, name


def copy_names(name: str):
    """``x.ipynb`` -> ``x (copy).ipynb``, ``x (copy 2).ipynb``, ..."""
    stem = name[: -len(NOTEBOOK)][:200]
    yield f"{stem} (copy){NOTEBOOK}"
    for n in range(2, _COPY_TRIES + 1):
        yield f"{stem} (copy {n}){NOTEBOOK}"


def write_copy(projects_root: str | Path, owner: str, project: str, name: str, data: bytes) -> str:
    """Write ``data`` at the top of ``owner/project`` under a free copy name; that name.

    The file is created exclusively (never over another) and given the owner of the
    project folder, so the project's container user can edit it.
    """
    dir_fd = open_project_dir(projects_root, owner, project)
    try:
        folder = os.fstat(dir_fd)
        for candidate in copy_names(name):
            if safefs.create_exclusive(dir_fd, candidate, data, folder.st_uid, folder.st_gid):
                return candidate
        raise FileRefused(409, f"Too many copies of {name} in {project} already.")
    finally:
        os.close(dir_fd)


def may_read(handler: BaseHandler, owner: str, project: str) -> bool:
    """Whether the logged-in user may read ``owner/project``'s files (see module doc)."""
    if handler.current_user.name == owner:
        return True
    server = f"server={owner}/{project}"
    return any(handler.has_scope(f"{s}!{server}") for s in (roles.READ, roles.WRITE, roles.EXECUTE))


@dataclass(frozen=True)
class Source:
    owner: str
    project: str
    path: str
    public: str = ""  # the public link's code, when that is what grants reading

    def query(self) -> str:
        if self.public:
            return urlencode({"public": self.public})
        return urlencode({"owner": self.owner, "project": self.project, "path": self.path})


class CopyHandler(BaseHandler):
    def initialize(self, public_links: bool):
        where = hubsettings.of_handler(self)  # the hub's own configuration
        self.projects_root = where.projects_root
        self.hub_dir = where.records_dir
        self.public_links = public_links
        saving = installs.GpulabSaveCopy(config=self.settings["config"])
        self.package_indexes = tuple(saving.package_indexes)

    async def _source(self) -> Source:
        """What to copy, checked against what the user may read (FileRefused if not)."""
        code = self.get_argument("public", "")
        if code:
            try:
                link = await self._run(find_link, self.hub_dir, code) if self.public_links else None
            except blocking.Busy as e:
                raise FileRefused(503, str(e)) from e
            if link is None:
                raise FileRefused(404, "That public link does not exist, or expired.")
            return Source(link.owner, link.project, link.path, public=code)
        owner = self.get_argument("owner", "")
        project = self.get_argument("project", "")
        path = self.get_argument("path", "")
        check_project(owner, project)
        check_path(path)
        found = self.find_user(owner)
        if found is None or project not in found.orm_user.orm_spawners:
            raise FileRefused(404, "No such project.")
        if not may_read(self, owner, project):
            raise FileRefused(404, "No such project.")  # not even its existence
        return Source(owner, project, path)

    def _own_projects(self) -> list[str]:
        return sorted(n for n in self.current_user.orm_user.orm_spawners if n)

    async def _installs(self, source: Source) -> installs.Found:
        """The source project's managed installs (none for a public link's notebook)."""
        if source.public:
            return installs.Found()
        return await self._run(installs.read_source, self.projects_root, source.owner,
                               source.project, self.package_indexes)  # fmt: skip

    async def _page(self, source: Source | None, status=200, error="", default="", **more):
        if source is not None and "installs" not in more:
            more["installs"] = await self._installs(source)
        html = await self.render_template(
            "gpulab-copy.html",
            source=source,
            projects=self._own_projects(),
            error=error,
            default=default,
            notebook_name=source.path.rsplit("/", 1)[-1] if source else "",
            **more,
        )
        self.set_status(status)
        self.finish(html)

    @web.authenticated
    async def get(self):
        try:
            source = await self._source()
        except FileRefused as e:
            await self._page(None, status=e.status, error=str(e))
            return
        await self._page(source, default=self.get_argument("target", source.project))

    def _new_project(self, typed: str) -> str:
        """A new project named as on the home page: the display name as typed, the
        project name made from it (JupyterHub's rules, :func:`new_project_names`)."""
        user = self.current_user
        display, name = new_project_names(typed)
        if name in user.orm_user.orm_spawners:
            raise FileRefused(
                400, f"You have a project named {name} already: choose it above, or another name."
            )
        limit = self.named_server_limit_per_user
        if limit and len(self._own_projects()) >= limit:
            raise FileRefused(400, f"You have {limit} projects, the most allowed.")
        user.get_or_create_spawner(name, display)
        return name

    def _target(self) -> str:
        new = self.get_body_argument("new_project", "").strip()
        if new:
            return self._new_project(new)
        target = self.get_body_argument("target", "")
        if target not in self._own_projects():
            raise FileRefused(400, "Choose one of your projects.")
        return target

    @web.authenticated
    async def post(self):
        try:
            source = await self._source()
        except FileRefused as e:
            await self._page(None, status=e.status, error=str(e))
            return
        me = self.current_user.name
        name = source.path.rsplit("/", 1)[-1]
        found = await self._installs(source)
        try:
            # What the page offered, checked against the lines read now: never the form's.
            lines, apt = self.get_body_arguments("install"), self.get_body_arguments("apt")
            chosen = installs.pick(found, lines, apt)
        except installs.NotOffered as e:
            self.log.warning("gpulab: %s's save a copy refused: %s", me, e)
            await self._page(source, status=400, error=f"Nothing was copied: {e}", installs=found)
            return
        try:
            data = await self._run(
                read_notebook, self.projects_root, source.owner, source.project, source.path
            )
            target = self._target()
            # A new project's folder and Dockerfile, as its first start would make them.
            spawner = self.current_user.spawners[target]
            await self._run(self._ensure_folder, spawner)
            copied = await self._run(write_copy, self.projects_root, me, target, name, data)
        except FileRefused as e:
            await self._page(source, status=e.status, error=str(e), installs=found)
            return
        self.log.info(
            "gpulab: %s saved a copy of %s/%s:%s as %s/%s",
            *(me, source.owner, source.project, source.path, target, copied),
        )
        lab = self.hub.base_url + f"user/{quote(me)}/{quote(target)}/lab/tree/{quote(copied)}"
        if not (found.any or found.problem or found.skipped):
            self.redirect(lab)
            return
        bring = chosen.any
        failed = await self._bring(spawner, target, chosen) if bring else ""
        if bring:
            shown, why = ", ".join(chosen.shown()), f" (not written: {failed})" if failed else ""
            self.log.info("gpulab: %s brought %s along into %s%s", me, shown, target, why)
        left = [i for i in found.shown() if i not in chosen.shown()]
        await self._page(
            source,
            installs=found,
            chosen=chosen,
            left=left,
            result={
                "copied": copied,
                "project": target,
                "lab": lab,
                "brought": bring and not failed,
                "failed": failed,
                "running": bool(spawner.ready),
            },
        )

    async def _bring(self, spawner, target: str, found: installs.Found) -> str:
        """Write the installs into ``target``'s Dockerfile; '' or why not."""
        me = self.current_user.name
        try:
            dir_fd = await self._run(open_project_dir, self.projects_root, me, target)
        except FileRefused as e:
            return str(e)
        try:
            folder = await self._run(os.fstat, dir_fd)
            user = f"{spawner.notebook_uid}:{spawner.notebook_gid}"
            return await installs.bring_along(dir_fd, found, user, folder.st_uid, folder.st_gid)
        finally:
            os.close(dir_fd)

    @staticmethod
    def _ensure_folder(spawner) -> None:
        project = getattr(spawner, "project", None)
        if not isinstance(project, Project) or project.path.is_dir():
            return
        text = spawner._render_dockerfile(project)
        safefs.ensure_project(project, text, *spawner.notebook_owner())

    async def _run(self, fn, *args):
        return await blocking.run(blocking.RECORDS, fn, *args)
