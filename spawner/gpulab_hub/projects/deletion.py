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
- its sharing records in the hub folder: the owner's sharing settings, public
  links, the roles mirroring group shares (JupyterHub removes its own share rows
  and share codes with the server); the owner's choice of secrets for it;
- its GPU holdings.

A user's deletion stops their servers first (JupyterHub 6.1's DELETE
/hub/api/users/<name> only stops the default server, then fails half-way on a
running named server: the account's password row was gone, its servers and
files stayed, and the next sign-up of that name inherited them). Then it takes
away, besides every project as above: the whole ``<projects_root>/<user>`` and
``<data_root>/projects/<user>``, the user's per-user data folders
(``<data_root>/{models,outputs}/<user>``: data_scope "user", or written before
"project" was the default), their per-user Hugging Face cache volume (removed: it
holds downloads, and a login token written before HF_TOKEN_PATH), any container of theirs
still there, the SSH keys they kept on the hub (ssh/keys.py), and their secrets
(secrets/store.py; removed, never archived).
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
from jupyterhub import orm
from jupyterhub import roles as hub_roles
from traitlets import Bool
from traitlets.config import Configurable

from gpulab_hub import hubsettings, ssh
from gpulab_hub.cluster import jobs as cluster_jobs
from gpulab_hub.gpus import allocator
from gpulab_hub.projects import objects, project_name, safe_owner
from gpulab_hub.secrets import store as secret_store
from gpulab_hub.sharing import groupshares
from gpulab_hub.sharing.public import store as public_links
from gpulab_hub.sharing.received import policy_store
from gpulab_hub.ssh.keys import KeyStore

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
    """The hub's sharing records and GPU holdings of one project (None: all of owner's)."""
    policies = policy_store(place.hub_dir)
    links = public_links(place.hub_dir)
    if project is None:
        policies.forget_owner(owner)
        links.forget_owner(owner)
        # A later account of the same name must not get in with these keys.
        KeyStore(ssh.paths(place.hub_dir)["keys_dir"]).remove_all(owner)
    else:
        policies.forget(owner, project)
        links.forget(owner, project)
    _forget_secrets(place, owner, project)
    # A new project of the same name must not inherit these jobs (cluster/jobs.py).
    cluster_jobs.record_of(place.hub_dir).forget(owner, project)
    store = allocator.AllocationStore(place.allocations_file)
    try:
        store.release_dead(lambda o, p: o != owner or (project is not None and p != project))
    except allocator.AllocationError as e:
        # A damaged GPU record is repaired from Docker by the next GPU spawn (which
        # sees no container of the deleted project); deleting goes on.
        LOG.error("GPU holdings of %s/%s not released now: %s", owner, project or "*", e)


def _forget_secrets(place: Place, owner: str, project: str | None) -> None:
    """The owner's choice of secrets for one project; all their secrets (None)."""
    folder = place.hub_dir / hubsettings.SECRETS
    try:
        if project is None:
            secret_store.forget_user(folder, owner)
        else:
            secret_store.SecretStore(folder, owner, LOG).forget_project(project)
    except ValueError:
        return  # not an account name gpulab allows: it never had secrets
    except (OSError, secret_store.SecretStore.Error) as e:
        LOG.error("The secrets of %s (%s) were not removed: %s", owner, project or "all", e)


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


# --- JupyterHub's database (on the hub's event loop thread) ---------------------------
def forget_group_roles(db, hub_dir: Path, owner: str, project: str | None) -> None:
    """The roles mirroring group shares of the project (None: of all owner's projects)."""
    roles = groupshares.GroupShareRoles(hub_dir / groupshares.FILE_NAME)
    for name in roles.forget(owner, project):
        if orm.Role.find(db, name) is not None:
            hub_roles.delete_role(db, name)


# --- entry points -----------------------------------------------------------------
async def _blocking(spawner, fn, *args):
    return await asyncio.get_running_loop().run_in_executor(spawner.executor, fn, *args)


async def delete_project(spawner) -> None:
    """ProjectSpawner.delete_forever: the server is stopped (JupyterHub checks)."""
    owner, project = spawner.user.name, project_name(spawner.name)
    place = place_of(spawner, owner)
    forget_group_roles(spawner.user.db, place.hub_dir, owner, project)
    done = await _blocking(spawner, project_files, place, owner, project)
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
    forget_group_roles(authenticator.db, place.hub_dir, user.name, None)
    loop = asyncio.get_running_loop()
    done = await loop.run_in_executor(
        spawner.executor, user_files, place, spawner.client, user.name
    )
    authenticator.log.info("gpulab: deleted user %s: %s", user.name, "; ".join(done) or "-")
