"""Renaming a project: its server, files, image record, shares and links move together.

JupyterHub 6.1 can change a server's display name but not its name, which is in the
server's URL, its shares' scopes (``!server=<owner>/<project>``), gpulab's folders and
records. The owner renames a stopped project at ``/hub/gpulab/rename/<project>`` (a form,
POST with JupyterHub's XSRF check) or with a token at
``POST /hub/api/gpulab/projects/<owner>/<project>/rename`` (``{"name": "<new>"}``).

What moves from ``<old>`` to ``<new>``:

- JupyterHub's server row (``orm.Spawner.name``): its shares and share codes reference
  the row, so they follow; their scopes are rewritten to ``!server=<owner>/<new>``, and
  so are API tokens' scopes that name the server. The server's OAuth client (gone with
  its last stop, unless the hub died) is removed: people authorize the new name once.
  The hub's in-memory spawner of the old name is dropped, so the next one is made
  afresh under the new name (URL, OAuth client id, container name);
- the project folder ``<projects_root>/<owner>/<old>``, its data folder
  ``<data_root>/projects/<owner>/<old>`` (models, outputs, Hugging Face cache) and the
  hub's record of it ``<state_root>/<owner>/<old>`` (last good image, build logs),
  renamed in place (each parent is the hub's; the entry itself is not followed);
- every per-project record in the hub folder (workflows/records.py lists them: the
  sharing settings, the public links, share links' access times, the owner's choice
  of secrets for it, the multi-node jobs, and the roles mirroring group shares, whose
  names and scopes name the project; the roles file is what the hub loads at start).

The display name stays, unless it was the old name itself (JupyterHub's default), which
becomes the new one; the owner may give another. The project must be stopped (no
container of it left). The new name follows the rules of every project name
(projects.project_name, checked whole) and must be free: no project, folder or hub
record of that name. If a step fails, what was moved is put back and one message says
so. Nothing is left under the old name: a new project of that name starts empty. The
rename is written in a journal in the hub's database before its first step
(workflows/journal.py): a hub killed in the middle finishes it as it starts
(workflows/recovery.py).

One rename of an owner's projects at a time (a file lock per owner, in the hub's
records folder); while it runs, the project is pending "rename" as JupyterHub's own
rename marks it, so no start, stop or delete of it begins. The folders and records
move on a thread of the records pool; JupyterHub's database changes on the hub's
event loop, which the rename's thread asks to do each of its steps.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import docker.errors
import requests.exceptions
import sqlalchemy as sa
from jupyterhub import orm
from jupyterhub.apihandlers import APIHandler
from jupyterhub.handlers import BaseHandler
from jupyterhub.scopes import needs_scope
from tornado import web

from gpulab_hub import blocking, records
from gpulab_hub.projects import (
    DEFAULT_PROJECT,
    ProjectError,
    objects,
    options,
    project_name,
    safe_owner,
)
from gpulab_hub.workflows import (
    TEMPLATES,  # noqa: F401 (the rename page)
    journal,
)
from gpulab_hub.workflows import records as registry
from gpulab_hub.workflows.deletion import place_of

PAGE = "/gpulab/rename"
API = "/api/gpulab/projects"
STOP_FIRST = "Stop the project first: a running project cannot be renamed."
# A project name, whole: what projects.project_name accepts (JupyterHub's safe slug).
NAME = re.compile(r"[a-z][a-z0-9]{0,29}(?:-[a-z0-9]+)*")
MAX_NAME = 30
STATE_KEYS = ("object_id", "object_name")  # DockerSpawner's record of a container
LOCKS = "renames"  # in the hub's records folder: <owner>.lock, one rename at a time
LOCK_S = blocking.LOCK_TIMEOUT  # how long a rename waits for the owner's other one


class RenameError(Exception):
    """A rename refused or failed; ``str()`` is the message for the owner."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Where:
    """The folders a rename touches, from the hub's settings (deletion.place_of)."""

    projects_root: Path
    state_root: Path | None
    hub_dir: Path
    data_root: Path | None = None
    allocations_file: Path | None = None

    def records(self, db, on_loop, log) -> records.Where:
        """Where the registered records are (records.Where)."""
        return records.Where(self.hub_dir, self.allocations_file, log, db, on_loop)

    def saved(self) -> dict[str, str | None]:
        """As the rename's row in the journal keeps it (JSON)."""
        return {k: None if v is None else str(v) for k, v in vars(self).items()}

    @classmethod
    def of_saved(cls, saved: dict) -> Where:
        return cls(**{k: None if v is None else Path(v) for k, v in saved.items()})

    def folders(self, owner: str) -> list[tuple[str, Path]]:
        """(what, the owner's hub folder holding one entry per project) that move."""
        found = [("project folder", self.projects_root / owner)]
        if self.data_root is not None:
            found.append(("data folders", self.data_root / objects.PROJECT_DATA / owner))
        if self.state_root is not None:
            found.append(("image record and build logs", self.state_root / owner))
        return found


# --- checks -----------------------------------------------------------------------
def check_new_name(new: str, old: str) -> str:
    """``new`` as a project name, or RenameError(400)."""
    if not isinstance(new, str) or len(new) > MAX_NAME or not NAME.fullmatch(new):
        raise RenameError(
            400,
            f"Invalid project name {str(new)[:40]!r}: use 1-30 lowercase letters, digits and "
            "single hyphens, starting with a letter (e.g. 'vision-2').",
        )
    try:
        project_name(new)
    except ProjectError as e:
        raise RenameError(400, str(e)) from e
    if new == DEFAULT_PROJECT:
        raise RenameError(400, f"{DEFAULT_PROJECT!r} is the name of the default project.")
    if new == old:
        raise RenameError(400, f"The project is called {old!r} already.")
    return new


def check_display_name(display: str | None) -> str | None:
    if display is None or display == "":
        return None
    if not isinstance(display, str):
        raise RenameError(400, "The display name must be text.")
    try:
        return options.check_display_name(display)
    except options.OptionsError as e:
        raise RenameError(400, str(e)) from e


def _exists(path: Path) -> bool:
    return os.path.lexists(path)


def check_free(where: Where, orm_user, owner: str, new: str) -> None:
    """RenameError(409) if anything of ``new`` exists already."""
    if new in orm_user.orm_spawners:
        raise RenameError(409, f"You have a project named {new!r} already.")
    check_folders_free(where, owner, new)


def check_folders_free(where: Where, owner: str, new: str) -> None:
    """RenameError(409) if a folder of ``new`` is left on the hub."""
    owner = safe_owner(owner)
    for _, parent in where.folders(owner):
        path = parent / new
        if _exists(path):
            raise RenameError(
                409,
                f"The name {new!r} is taken: a folder of that name is left on the hub "
                "(from an earlier project). Choose another name, or ask the administrator.",
            )


# --- the steps, each with its undo ------------------------------------------------
@dataclass
class Steps:
    """What was done so far, and how to put each back (last first)."""

    done: list[tuple[str, Callable[[], None]]] = field(default_factory=list)

    def add(self, what: str, undo: Callable[[], None]) -> None:
        self.done.append((what, undo))

    def undo(self, log) -> list[str]:
        """Put everything back; what could not be."""
        failed = []
        for what, undo in reversed(self.done):
            try:
                undo()
            except Exception as e:  # noqa: BLE001 (each undo is tried; failures reported)
                log.error("gpulab: rename: could not put back %s: %s", what, e)
                failed.append(f"{what} ({e})")
        return failed


def move_folder(parent: Path, old: str, new: str) -> bool:
    """Rename ``parent/old`` to ``parent/new`` (never onto anything); False if no ``old``.
    ``parent`` is the hub's folder of the owner; the entry itself is not followed."""
    try:
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        try:
            os.stat(old, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        try:
            os.stat(new, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            os.rename(old, new, src_dir_fd=fd, dst_dir_fd=fd)
            return True
        raise FileExistsError(f"{parent / new} exists already")
    finally:
        os.close(fd)


def _server_scope(scope: str, owner: str, old: str, new: str) -> str:
    base, _, filter_ = scope.partition("!")
    return f"{base}!server={owner}/{new}" if filter_ == f"server={owner}/{old}" else scope


def _rewrite_tokens(db, owner: str, old: str, new: str) -> None:
    """API tokens whose scopes name ``owner/old`` name ``owner/new``."""
    # The scopes column as text (JupyterHub's JSON type would not be cached by SQLAlchemy).
    table = orm.APIToken.__tablename__
    found = sa.text(f"SELECT id FROM {table} WHERE scopes LIKE :like")
    ids = [row[0] for row in db.execute(found, {"like": f"%server={owner}/{old}%"})]
    for token in db.query(orm.APIToken).filter(orm.APIToken.id.in_(ids)) if ids else ():
        scopes = [_server_scope(s, owner, old, new) for s in token.scopes or []]
        if scopes != list(token.scopes or []):
            token.scopes = scopes


def _drop_oauth_clients(db, orm_spawner, owner: str, names: tuple[str, ...]) -> None:
    """The server's OAuth clients of these names (JupyterHub's ids), with their tokens."""
    from urllib.parse import quote

    idents = {f"jupyterhub-user-{quote(owner)}-{quote(n)}" for n in names}
    clients = set(db.query(orm.OAuthClient).filter(orm.OAuthClient.identifier.in_(idents)))
    if orm_spawner.oauth_client is not None:
        clients.discard(orm_spawner.oauth_client)
        orm_spawner.oauth_client = None  # delete-orphan: the client goes with its tokens
    for client in clients:
        db.delete(client)


def rename_row(db, orm_spawner, old: str, new: str, display: str | None) -> None:
    """JupyterHub's server row and what names it (committed)."""
    owner = orm_spawner.user.name
    orm_spawner.name = new
    orm_spawner.display_name = display
    for share in [*orm_spawner.shares, *orm_spawner.share_codes]:
        share.scopes = sorted(
            orm.Share._apply_filter(frozenset(share._scopes or ()), owner, new, check=False)
        )
    _rewrite_tokens(db, owner, old, new)
    _drop_oauth_clients(db, orm_spawner, owner, (old, new))
    state = dict(orm_spawner.state or {})
    if any(key in state for key in STATE_KEYS):  # no container is left (checked)
        orm_spawner.state = {k: v for k, v in state.items() if k not in STATE_KEYS}
    db.commit()


# --- the rename --------------------------------------------------------------------
def _names(orm_spawner) -> tuple[str, str, str | None]:
    """On the loop: the owner, the project's name and its display name."""
    return orm_spawner.user.name, orm_spawner.name, orm_spawner.display_name


def _taken(orm_spawner, new: str) -> bool:
    return new in orm_spawner.user.orm_spawners


class Taken(Exception):
    """A project of the new name was made while the folders and records moved."""


def _rename_row_if_free(db, orm_spawner, old: str, new: str, display: str | None) -> None:
    """On the loop: :func:`rename_row`, unless a project named ``new`` was made since the
    rename began (its folders and records moved meanwhile, off the loop)."""
    if _taken(orm_spawner, new):
        raise Taken(f"a project named {new!r} was made meanwhile")
    rename_row(db, orm_spawner, old, new, display)


def _begin(db, orm_spawner, where: Where, new: str, display: str | None) -> int:
    """On the loop: the rename's row in the journal (workflows/journal.py)."""
    owner, old = orm_spawner.user.name, orm_spawner.name
    saved = where.saved()
    return journal.begin(db, orm_spawner.id, journal.RENAME, owner, old, saved, new, display)


def _end(db, entry: int, log) -> None:
    """On the loop: the rename's row crossed out; if that fails, the hub's next start
    finds the row and finishes the rename (each of its steps is done already)."""
    try:
        journal.end(db, entry)
    except sa.exc.SQLAlchemyError as e:
        db.rollback()
        log.error("gpulab: rename: its row in the journal stays (%s); the next start ends it", e)


def move(
    db, orm_spawner, where: Where, new: str, display: str | None, log, on_loop=records.run_here
) -> list[str]:
    """Blocking (a thread of the records pool, holding the owner's rename lock): rename
    the stopped project of ``orm_spawner`` to ``new``; what was moved. JupyterHub's
    database is changed through ``on_loop`` (records.Where.on_loop). RenameError if a
    step fails, after putting back what was done. The rename is written in the journal
    before its first step and crossed out after its last (or once all was put back): a
    hub killed in between finishes it as it starts (workflows/recovery.py)."""
    owner, old, old_display = on_loop(_names, orm_spawner)
    owner = safe_owner(owner)
    if display is None:
        display = new if old_display in (None, "", old) else old_display
    at = where.records(db, on_loop, log)
    steps, moved = Steps(), []
    step = "checking the names"
    entry = None
    try:
        if on_loop(_taken, orm_spawner, new):
            raise RenameError(409, f"You have a project named {new!r} already.")
        check_folders_free(where, owner, new)
        step = "writing the rename down"
        entry = on_loop(_begin, db, orm_spawner, where, new, display)
        for what, parent in where.folders(owner):
            step = f"moving the {what}"
            if move_folder(parent, old, new):
                steps.add(what, lambda p=parent: move_folder(p, new, old))
                moved.append(what)
        for record in registry.files(at):
            if not (record.per_project and record.moves):
                continue
            step = f"moving the {record.what}"
            undo = record.move(owner, old, new)
            if undo is not None:
                steps.add(record.what, undo)
                moved.append(record.what)
        step = "renaming the server, its shares and share links"
        on_loop(_rename_row_if_free, db, orm_spawner, old, new, display)
        server = registry.server(at)

        def undo_row() -> None:  # the server's records follow the row: made again after it
            on_loop(rename_row, db, orm_spawner, new, old, old_display)
            for record in server:
                record.move(owner, new, old)

        steps.add("server, shares, share links and group shares' roles", undo_row)
        moved.append("server, shares and share links")
        for record in server:
            step = f"moving the {record.what}"
            if record.move(owner, old, new) is not None:
                moved.append(record.what)
        on_loop(_end, db, entry, log)
    except RenameError:
        raise
    except Exception as e:
        on_loop(db.rollback)
        log.exception("gpulab: renaming %s/%s to %s failed while %s", owner, old, new, step)
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        failed = steps.undo(log)
        if failed:  # the journal's row stays: the hub's next start finishes the rename
            left = "; ".join(failed)
            raise RenameError(
                500,
                f"Renaming {old!r} to {new!r} failed while {step} ({reason}), and this could "
                f"not be put back: {left}. The hub finishes the rename to {new!r} when it "
                "next starts; ask the administrator to restart it.",
            ) from e
        if entry is not None:
            on_loop(_end, db, entry, log)
        raise RenameError(
            500,
            f"Renaming {old!r} to {new!r} failed while {step} ({reason}); everything was "
            f"put back, so the project is {old!r} as before.",
        ) from e
    return moved


def move_locked(db, orm_spawner, where: Where, new: str, display, log, on_loop) -> list[str]:
    """:func:`move` holding the owner's rename lock (blocking: the records pool)."""
    owner = safe_owner(on_loop(_names, orm_spawner)[0])
    folder = where.hub_dir / LOCKS
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        with blocking.file_lock(folder / f"{owner}.lock", "your list of projects", LOCK_S):
            return move(db, orm_spawner, where, new, display, log, on_loop)
    except blocking.Busy as e:
        raise RenameError(409, str(e)) from e


def _containers(client, prefix: str, owner: str, project: str) -> list[str]:
    labels = [f"gpulab.instance={prefix}", f"gpulab.owner={owner}", f"gpulab.project={project}"]
    return [c["Id"] for c in client.containers(all=True, filters={"label": labels})]


def _active(user, name: str) -> bool:
    spawner = dict.get(user.spawners, name)  # never makes one
    if spawner is not None and (spawner.active or spawner.pending or spawner.ready):
        return True
    orm_spawner = user.orm_spawners.get(name)
    return orm_spawner is not None and orm_spawner.server is not None


async def rename_project(user, old: str, new: str, display: str | None = None) -> list[str]:
    """Rename ``user``'s (a JupyterHub User's) stopped project ``old`` to ``new``; what
    moved. RenameError with the message for the owner otherwise."""
    if not old or user.orm_spawners.get(old) is None:
        raise RenameError(404, f"You have no project named {old!r}.")
    new = check_new_name(new, old)
    display = check_display_name(display)
    if _active(user, old):
        raise RenameError(409, STOP_FIRST)
    made = old not in user.spawners
    spawner = user.spawners[old]
    renamed = False
    try:
        place = place_of(spawner, user.name)
        where = Where(
            place.projects_root,
            place.state_root,
            place.hub_dir,
            place.data_root,
            place.allocations_file,
        )
        check_free(where, user.orm_user, user.name, new)
        # JupyterHub's own mark of a rename: no start, stop or delete of it begins now.
        spawner._rename_pending = True
        try:
            left = await blocking.run(
                blocking.DOCKER,
                lambda: _containers(spawner.client, spawner.prefix, user.name, old),
            )
        except (docker.errors.DockerException, requests.exceptions.ConnectionError) as e:
            raise RenameError(
                503,
                "The Docker engine is not reachable, so gpulab cannot tell whether the project "
                "still has a container; nothing was renamed. Try again later.",
            ) from e
        if left:
            raise RenameError(409, STOP_FIRST + " (a container of it is still there).")
        if user.orm_spawners.get(old) is None:
            raise RenameError(409, STOP_FIRST)
        on_loop = records.on_loop_of(asyncio.get_running_loop())
        moved = await blocking.run(
            blocking.RECORDS,
            move_locked,
            user.db,
            user.orm_spawners[old],
            where,
            new,
            display,
            spawner.log,
            on_loop,
        )
        renamed = True
    finally:
        spawner._rename_pending = False
        # A spawner made here only to look is dropped; after a rename, the one of the old
        # name too (it knew the old URL, OAuth client and container name).
        if made or renamed:
            dict.pop(user.spawners, old, None)
        if renamed:
            dict.pop(user.spawners, new, None)
    spawner.log.info("gpulab: %s renamed %s to %s: %s", user.name, old, new, ", ".join(moved))
    return moved


def done_message(old: str, new: str, moved: list[str]) -> str:
    return f"Renamed {old} to {new}." + (f" Moved: {', '.join(moved)}." if moved else "")


# --- pages and API -------------------------------------------------------------------
class RenameHandler(BaseHandler):
    """/hub/gpulab/rename/<project>: the owner's form; POST renames."""

    def _own(self, project: str):
        orm_spawner = self.current_user.orm_spawners.get(project) if project else None
        if orm_spawner is None:
            raise web.HTTPError(404, f"You have no project named {project!r}.")
        if not self.has_scope(f"servers!server={self.current_user.name}/{project}"):
            raise web.HTTPError(403, "You may not rename this project.")
        return orm_spawner

    async def _page(self, project: str, status=200, message="", error="", new_name=""):
        orm_spawner = self._own(project)
        html = await self.render_template(
            "gpulab-rename.html",
            project=project,
            display_name=orm_spawner.display_name or project,
            running=_active(self.current_user, project),
            message=message,
            error=error,
            new_name=new_name,
        )
        self.set_status(status)
        self.finish(html)

    @web.authenticated
    async def get(self, project: str):
        await self._page(project)

    @web.authenticated
    async def post(self, project: str):
        self._own(project)
        # Whole values, as sent (tornado strips by default: "lab\n" would pass as "lab").
        new = self.get_body_argument("new_name", "", strip=False)
        display = self.get_body_argument("display_name", "", strip=False)
        try:
            moved = await rename_project(self.current_user, project, new, display)
        except RenameError as e:
            await self._page(project, status=e.status, error=str(e), new_name=new[:MAX_NAME])
            return
        await self._page(new, message=done_message(project, new, moved))


class RenameAPIHandler(APIHandler):
    """POST /hub/api/gpulab/projects/<owner>/<project>/rename, body ``{"name": "<new>",
    "display_name": "<optional>"}``: the owner's token (with ``servers`` on it)."""

    @needs_scope("servers")
    async def post(self, user_name: str, server_name: str):
        me = self.current_user
        if me is None or getattr(me, "name", None) != user_name or not hasattr(me, "spawners"):
            raise web.HTTPError(403, "Only the project's owner may rename it.")
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError as e:
            raise web.HTTPError(400, "The body must be JSON.") from e
        if not isinstance(body, dict) or not set(body) <= {"name", "display_name"}:
            raise web.HTTPError(400, 'The body is {"name": ..., "display_name": ...}.')
        new, display = body.get("name", ""), body.get("display_name")
        if not isinstance(new, str) or not (display is None or isinstance(display, str)):
            raise web.HTTPError(400, "name and display_name must be text.")
        try:
            moved = await rename_project(me, server_name, new, display)
        except RenameError as e:
            raise web.HTTPError(e.status, str(e)) from e
        message = done_message(server_name, new, moved)
        reply = {"old": server_name, "name": new, "moved": moved, "message": message}
        self.write(json.dumps(reply))


def hub_handlers() -> list[tuple]:
    """JupyterHub ``extra_handlers`` of renaming (hubconfig.py adds them)."""
    return [
        (PAGE + r"/([^/]+)", "gpulab_hub.workflows.rename.RenameHandler"),
        (API + r"/([^/]+)/([^/]+)/rename", "gpulab_hub.workflows.rename.RenameAPIHandler"),
    ]
