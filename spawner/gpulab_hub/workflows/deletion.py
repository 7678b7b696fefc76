"""Deleting a user or a project: nothing of it passes to a later account of that name.

JupyterHub calls ``Spawner.delete_forever`` when a named server is deleted with
``remove=true`` and, for each of the user's servers, when a user is deleted; it
calls ``Authenticator.delete_user`` first when a user is deleted. gpulab wires
:func:`delete_project` to the first and :func:`delete_user` to the second.

A project's deletion takes away:

- its folder ``<projects_root>/<user>/<project>``, its data folder
  ``<data_root>/projects/<user>/<project>`` (its models, outputs and Hugging Face
  cache, data_scope "project") and the hub's record of it
  ``<state_root>/<user>/<project>`` (last good image, build logs): archived into
  ``<hub>/deleted/<user>-<UTC time>/`` (``GpulabDeletion.archive``, the default) or
  removed. The archive folder is the hub's (0700); no container mounts it and no
  account can reach it; an admin restores or purges it by hand;
- every per-project record the hub keeps (workflows/records.py lists them: the
  owner's sharing settings, public links, share links' access times, the roles
  mirroring group shares, the owner's choice of secrets, its multi-node jobs, its GPU
  holdings); JupyterHub removes its own share rows and share codes with the server.

A user's deletion stops their servers first (JupyterHub 6.1's DELETE
/hub/api/users/<name> only stops the default server, then fails half-way on a
running named server: the account's password row was gone, its servers and
files stayed, and the next sign-up of that name inherited them). Then it takes
away, besides every project as above: the whole ``<projects_root>/<user>`` and
``<data_root>/projects/<user>``, the user's per-user data folders
(``<data_root>/{models,outputs}/<user>``: data_scope "user", or written before
"project" was the default), their per-user Hugging Face cache volume (removed: it
holds downloads, and a login token written before HF_TOKEN_PATH), any container of theirs
still there, and every record of theirs in the registry (``forget_owner``): the SSH keys
they kept on the hub (ssh/keys.py) and their secrets (secrets/store.py; removed, never
archived) among them.

The files and records are blocking work, done on the records pool; the roles in
JupyterHub's database are changed on the hub's event loop.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import docker.errors
from traitlets import Bool
from traitlets.config import Configurable

from gpulab_hub import blocking, hubsettings, records
from gpulab_hub.projects import objects, project_name, safe_owner
from gpulab_hub.workflows import journal
from gpulab_hub.workflows import records as registry

LOG = logging.getLogger("gpulab.deletion")
ARCHIVE_DIR = hubsettings.DELETED
STOP_WAIT_S = 120


class GpulabDeletion(Configurable):
    """Where deleting a user or project puts what it had."""

    archive = Bool(
        True,
        config=True,
        help="""True: a deleted user's or project's folders are moved into
        ``<records_dir>/deleted/<user>-<UTC time>/`` (ProjectSpawner.records_dir,
        private to the hub; an admin
        restores or purges them); False: they are removed at once. Either way no
        later account of the same name gets them. Default: True
        (GPULAB_DELETED_FILES=archive).
        Example: ``c.GpulabDeletion.archive = False``""",
    )


@dataclass(frozen=True)
class Place:
    """What deletion needs to know, read from a ProjectSpawner's settings."""

    projects_root: Path
    state_root: Path | None
    data_root: Path
    hub_dir: Path
    archive: bool
    allocations_file: Path
    prefix: str
    hf_volume: str  # the user's volume name, formatted

    def saved(self) -> dict:
        """As the deletion's row in the journal keeps it (JSON)."""
        kept = (bool, str, type(None))
        return {k: v if isinstance(v, kept) else str(v) for k, v in vars(self).items()}

    @classmethod
    def of_saved(cls, saved: dict) -> Place:
        paths = ("projects_root", "state_root", "data_root", "hub_dir", "allocations_file")
        return cls(**{k: Path(v) if k in paths and v is not None else v for k, v in saved.items()})

    def records(self, db=None, on_loop=records.run_here) -> records.Where:
        """Where the registered records of this hub are (records.Where)."""
        return records.Where(self.hub_dir, self.allocations_file, LOG, db, on_loop)

    def archive_dir(self, owner: str) -> Path:
        """A new ``<hub>/deleted/<owner>-<time>`` folder (made, 0700)."""
        root = self.hub_dir / ARCHIVE_DIR
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        root.chmod(0o700)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        for n in range(1, 1000):
            path = root / (f"{owner}-{stamp}" + (f"-{n}" if n > 1 else ""))
            try:
                path.mkdir(mode=0o700)
                return path
            except FileExistsError:
                continue
        raise OSError(errno.EEXIST, f"no free archive folder name for {owner} in {root}")


def place_of(spawner, owner: str) -> Place:
    settings = GpulabDeletion(config=spawner.config)
    state_root = getattr(spawner, "state_root", "")
    return Place(
        projects_root=Path(spawner.projects_root),
        state_root=Path(state_root) if state_root else None,
        data_root=Path(spawner.data_root),
        hub_dir=Path(spawner.records_dir),
        archive=settings.archive,
        allocations_file=Path(spawner.allocations_file),
        prefix=spawner.prefix,
        hf_volume=spawner.hf_cache_volume.format(
            prefix=spawner.prefix, username=spawner.escape(owner)
        ),
    )


# --- files ------------------------------------------------------------------------
def _take_away(src: Path, place: Place, owner: str, into: str, archive: list) -> str | None:
    """Archive ``src`` (a folder) as ``<archive>/<into>``, or remove it; a link is only
    unlinked. What was done, or None when there was nothing."""
    if not src.exists() and not src.is_symlink():
        return None
    if src.is_symlink() or not src.is_dir():
        src.unlink()
        return f"removed {src}"
    if not place.archive:
        shutil.rmtree(src)  # fd-based: follows no link
        return f"removed {src}"
    if not archive:
        archive.append(place.archive_dir(owner))
    dest = archive[0] / into
    dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        src.rename(dest)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        shutil.move(str(src), str(dest))
    return f"archived {src} as {dest}"


def _forget_records(place: Place, owner: str, project: str | None) -> None:
    """Blocking: the records kept in files of one project (None: of all of owner's),
    every store of the registry in its order."""
    for record in registry.files(place.records()):
        if project is None:
            record.forget_owner(owner)
        elif record.per_project:
            record.forget(owner, project)


def forget_server_records(where: records.Where, owner: str, project: str | None) -> None:
    """Blocking: the records that mirror JupyterHub's database (the group shares'
    roles), of one project (None: of all of owner's); their database part runs on
    ``where.on_loop``."""
    for record in registry.server(where):
        if project is None:
            record.forget_owner(owner)
        elif record.per_project:
            record.forget(owner, project)


def project_files(place: Place, owner: str, project: str) -> list[str]:
    """Blocking: the project's folder, state and records; what was done."""
    owner = safe_owner(owner)
    archive: list[Path] = []
    folder = place.projects_root / owner / project
    done = [_take_away(folder, place, owner, f"projects/{project}", archive)]
    data = place.data_root / objects.PROJECT_DATA / owner / project
    done.append(_take_away(data, place, owner, f"data/{objects.PROJECT_DATA}/{project}", archive))
    if place.state_root is not None:
        state = place.state_root / owner / project
        done.append(_take_away(state, place, owner, f"state/{project}", archive))
    _forget_records(place, owner, project)
    return [d for d in done if d]


def user_files(place: Place, docker_client, owner: str) -> list[str]:
    """Blocking: everything of ``owner`` outside JupyterHub's database; what was done."""
    owner = safe_owner(owner)
    done = _remove_containers(docker_client, place.prefix, owner)
    archive: list[Path] = []
    done.append(_take_away(place.projects_root / owner, place, owner, "projects", archive))
    if place.state_root is not None:
        done.append(_take_away(place.state_root / owner, place, owner, "state", archive))
    for sub in (*objects.PER_USER_DATA, objects.PROJECT_DATA):
        done.append(_take_away(place.data_root / sub / owner, place, owner, f"data/{sub}", archive))
    done.append(_remove_volume(docker_client, place.hf_volume))
    _forget_records(place, owner, None)
    return [d for d in done if d]


# --- Docker -----------------------------------------------------------------------
def _remove_containers(client, prefix: str, owner: str) -> list[str]:
    labels = [f"gpulab.instance={prefix}", f"gpulab.owner={owner}"]
    done = []
    for c in client.containers(all=True, filters={"label": labels}):
        try:
            client.remove_container(c["Id"], force=True, v=True)
        except docker.errors.NotFound:
            continue
        done.append(f"removed container {c['Names'][0].lstrip('/')}")
    return done


def _remove_volume(client, name: str) -> str | None:
    try:
        client.remove_volume(name, force=True)
    except docker.errors.NotFound:
        return None
    return f"removed volume {name}"


# --- entry points -----------------------------------------------------------------
def finish(db, place: Place, owner: str, project: str, orm_spawner) -> list[str]:
    """Blocking, JupyterHub's session in this thread (a hub finishing a deletion it
    was killed in, as it starts: workflows/recovery.py): the project's records and
    files, then its server row, whose removal takes the journal's row with it."""
    forget_server_records(place.records(db), owner, project)
    done = project_files(place, owner, project)
    db.delete(orm_spawner)
    db.commit()
    return done


async def delete_project(spawner) -> None:
    """ProjectSpawner.delete_forever: the server is stopped (JupyterHub checks). The
    deletion is written in the journal first (workflows/journal.py); JupyterHub's
    removal of the server row, after this, takes that row with it. A hub killed in
    between finishes the deletion as it starts."""
    owner, project = spawner.user.name, project_name(spawner.name)
    place = place_of(spawner, owner)
    loop = asyncio.get_running_loop()
    db = spawner.user.db
    where = place.records(db, records.on_loop_of(loop))
    server_id = spawner.orm_spawner.id
    entry = journal.begin(db, server_id, journal.DELETE, owner, project, place.saved())
    try:
        await blocking.run(blocking.RECORDS, forget_server_records, where, owner, project)
        done = await blocking.run(blocking.RECORDS, project_files, place, owner, project)
    except BaseException:
        journal.end(db, entry)  # as before: the deletion failed and says so; tried again
        raise
    spawner.log.info("gpulab: deleted project %s/%s: %s", owner, project, "; ".join(done) or "-")


async def stop_servers(user, timeout: float = STOP_WAIT_S) -> None:
    """Stop every server of ``user`` (a JupyterHub User), as the hub's stop API does."""
    proxy = user.settings.get("proxy")
    for name in list(user.orm_user.orm_spawners):
        if name not in user.spawners:  # never made since the hub started: not running
            continue
        spawner = user.spawners[name]
        future = getattr(spawner, "_spawn_future", None)
        if spawner.pending == "spawn" and future is not None:
            future.cancel()
        deadline = time.monotonic() + timeout
        while spawner.pending and spawner.pending != "spawn" and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        if spawner.active:
            if proxy is not None:
                await proxy.delete_user(user, name)
            await user.stop(name)


async def delete_user(authenticator, user) -> None:
    """Authenticator.delete_user: stop the user's servers, then take away their files."""
    if hasattr(user, "orm_user"):
        await stop_servers(user)
    spawner_class = getattr(user, "spawner_class", None)
    if not hasattr(spawner_class, "records_dir"):  # not gpulab's ProjectSpawner
        return
    spawner = spawner_class(config=authenticator.config)
    place = place_of(spawner, user.name)
    loop = asyncio.get_running_loop()
    where = place.records(authenticator.db, records.on_loop_of(loop))
    await blocking.run(blocking.RECORDS, forget_server_records, where, user.name, None)
    # The Docker client is made on the pool's thread (it asks the engine its version).
    done = await blocking.run(blocking.DOCKER, lambda: user_files(place, spawner.client, user.name))
    authenticator.log.info("gpulab: deleted user %s: %s", user.name, "; ".join(done) or "-")
