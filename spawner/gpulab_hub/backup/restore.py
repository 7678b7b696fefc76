"""``gpulab restore``: a hub's state from a ``gpulab backup`` archive, onto GPULAB_HOME.

Before anything is written: the manifest is read (an archive of a newer gpulab or a
newer layout is refused), every member is checked against it (listed, of the listed
kind, sha256 and size), and no name may be absolute or hold ``..``. Members are then
extracted with tarfile's ``data`` filter into a new private folder inside GPULAB_HOME
(so no link already there is ever written through), and moved into place: ``hub``,
``projects`` and ``jupyterhub_config.d``. A link of a user's that points outside the
restored folders is left out (and named); project files keep their owners.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import sqlite3
import tarfile
import time
import zlib
from pathlib import Path

from packaging.version import InvalidVersion, Version

from gpulab_hub import hubfiles, stateversion
from gpulab_hub.backup import CONFIG_D, DATABASE, FORMAT, HUB, MANIFEST, PROJECTS, BackupError
from gpulab_hub.backup import version as gpulab_version
from gpulab_hub.backup.make import DELETED

MAX_MANIFEST = 256 << 20
CHUNK = 1 << 20
TOPS = (HUB, PROJECTS, CONFIG_D)
USER_TREES = (f"{PROJECTS}/", f"{HUB}/{DELETED}/")  # where links may be (users' own)


def destinations(home: Path, hub_dir: Path, projects_root: Path) -> dict[str, Path]:
    return {HUB: hub_dir, PROJECTS: projects_root, CONFIG_D: home / hubfiles.CONFIG_D}


def _open(archive: Path) -> tarfile.TarFile:
    if not archive.is_file():
        raise BackupError(f"There is no archive {archive}.")
    try:
        return tarfile.open(archive, "r:gz")
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        raise BackupError(
            f"{archive} is not a gpulab backup: it is not a .tar.gz archive ({e})."
        ) from e


def read_manifest(tar: tarfile.TarFile, archive: Path) -> dict:
    """The archive's manifest, checked: a gpulab backup of a layout and version this
    gpulab reads."""
    try:
        member = tar.getmember(MANIFEST)
    except KeyError:
        raise BackupError(f"{archive} is not a gpulab backup: it has no {MANIFEST}.") from None
    if not member.isreg() or member.size > MAX_MANIFEST:
        raise BackupError(f"{archive}'s {MANIFEST} is not a manifest gpulab wrote.")
    try:
        manifest = json.loads(tar.extractfile(member).read())
        theirs, fmt, members = manifest["gpulab"], manifest["format"], manifest["members"]
        if not isinstance(fmt, int) or not isinstance(members, dict):
            raise TypeError("format or members of the wrong kind")
        their_version = Version(theirs)
    except (ValueError, KeyError, TypeError, InvalidVersion) as e:
        raise BackupError(f"{archive}'s {MANIFEST} is damaged ({e}); it cannot be restored.") from e
    mine = gpulab_version()
    if their_version > Version(mine) or fmt > FORMAT:
        raise BackupError(
            f"{archive} was written by gpulab {theirs}, which is newer than this gpulab "
            f"({mine}): restore it with gpulab {theirs} or later (update gpulab here first)."
        )
    try:
        stateversion.check_formats(manifest.get("state_formats", {}), str(archive))
    except stateversion.NewerState as e:
        raise BackupError(f"{e}.") from e
    except ValueError as e:
        raise BackupError(f"{archive}'s {MANIFEST} is damaged ({e}); it cannot be restored.") from e
    return manifest


def _unsafe(name: str) -> bool:
    parts = name.split("/")
    return name.startswith("/") or "\\" in name or ".." in parts or "" in parts[:-1]


def verify(tar: tarfile.TarFile, manifest: dict, archive: Path, say=print) -> list[tarfile.TarInfo]:
    """Every member of the archive, each checked against the manifest (see the module's doc)."""
    listed = manifest["members"]
    seen, members, files = set(), [], 0
    refuse = "it was changed or damaged after gpulab wrote it; nothing was restored"
    for m in tar:
        if m.name == MANIFEST:
            continue
        if _unsafe(m.name) or m.name.split("/")[0] not in TOPS:
            raise BackupError(
                f"{archive} holds {m.name[:200]!r}, a path outside the folders gpulab restores "
                f"(an absolute path or one with '..'): {refuse}."
            )
        entry = listed.get(m.name)
        kind = "file" if m.isreg() else "folder" if m.isdir() else "link" if m.issym() else "other"
        if kind == "other":
            raise BackupError(
                f"{archive} holds {m.name[:200]!r}, which is no file, folder or link (a hard "
                f"link or a device): {refuse}."
            )
        if not isinstance(entry, dict) or entry.get("type") != kind:
            raise BackupError(
                f"{archive} holds {m.name[:200]!r}, not as its manifest lists: {refuse}."
            )
        if kind == "link" and not m.name.startswith(USER_TREES):
            raise BackupError(
                f"{archive} holds a link {m.name[:200]!r} in the hub's folder: {refuse}."
            )
        if kind == "file":
            sha, f = hashlib.sha256(), tar.extractfile(m)
            while chunk := f.read(CHUNK):
                sha.update(chunk)
            if sha.hexdigest() != entry.get("sha256") or m.size != entry.get("size"):
                raise BackupError(
                    f"{archive}'s {m.name[:200]} does not match its sha256 in the manifest: "
                    f"{refuse}."
                )
            files += 1
        seen.add(m.name)
        members.append(m)
    missing = sorted(set(listed) - seen)
    if missing:
        raise BackupError(
            f"{archive} lacks {len(missing)} of the files its manifest lists (first: "
            f"{missing[0][:200]}): it is cut short or damaged; nothing was restored."
        )
    say(f"Checked the archive: {files} files match their sha256 sums in the manifest.")
    return members


def _conflicts(dest: dict[str, Path]) -> list[str]:
    """What a restore would replace that holds a hub's state (refused without --force)."""
    found = []
    if (dest[HUB] / DATABASE).exists():
        found.append(f"a hub database ({dest[HUB] / DATABASE})")
    projects = dest[PROJECTS]
    if projects.is_dir() and any(not e.name.startswith(".") for e in os.scandir(projects)):
        found.append(f"project folders ({projects})")
    config_d = dest[CONFIG_D]
    if config_d.is_dir() and any(os.scandir(config_d)):
        found.append(f"configuration files ({config_d})")
    return found


def restore(
    archive: Path,
    *,
    home: Path,
    hub_dir: Path,
    projects_root: Path,
    force: bool,
    running: str,
    environ,
    say=print,
) -> dict:
    """Restore ``archive`` onto the hub at ``home`` (its GPULAB_HOME; ``hub_dir`` its own
    folder, project folders to ``projects_root``); ``running``: a sentence naming the hub
    that runs there ("" when none); ``environ``: the hub's environment. -> the manifest."""
    home = Path(home)
    dest = destinations(home, Path(hub_dir), Path(projects_root))
    if running:
        raise BackupError(
            f"A hub runs on {home} ({running}): stop it with `gpulab down` before you restore."
        )
    found = _conflicts(dest)
    if found and not force:
        raise BackupError(
            f"{home} already has a hub's state: {', '.join(found)}. Restore onto a new "
            "GPULAB_HOME, or add --force to move what is there aside (to "
            "<name>.before-restore-<time>) and restore in its place."
        )
    say(f"Reading {archive}...")
    with _open(archive) as tar:
        try:
            manifest = read_manifest(tar, archive)
            say(f"It is a backup of {manifest.get('home', '?')} made by gpulab "
                f"{manifest['gpulab']} at {manifest.get('created', '?')}.")  # fmt: skip
            members = verify(tar, manifest, archive, say)
        except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
            raise BackupError(
                f"{archive} is not a gpulab backup, or it is damaged or cut short ({e}); "
                "nothing was restored."
            ) from e
        home.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        stage = home / f".gpulab-restore-{stamp}"
        stage.mkdir(mode=0o700)
        try:
            skipped = _extract(tar, members, stage, say)
            moved = _move_into_place(stage, dest, stamp, {m.name.split("/")[0] for m in members})
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    for line in moved:
        say(line)
    for line in skipped[:20]:
        say(f"  left out: {line}")
    _summary(dest, manifest, environ, say)
    return manifest


def _extract(tar: tarfile.TarFile, members, stage: Path, say) -> list[str]:
    (stage / HUB).mkdir(mode=0o700)
    (stage / PROJECTS).mkdir(mode=0o755)
    os.chmod(stage / PROJECTS, 0o755)  # whatever the umask: containers' engine reaches it
    (stage / CONFIG_D).mkdir(mode=0o700)
    skipped: list[str] = []

    def keep(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
        try:
            safe = tarfile.data_filter(member, path)
        except tarfile.FilterError as e:
            if member.issym() and member.name.startswith(USER_TREES):
                skipped.append(f"{member.name} (a link to {member.linkname[:200]!r}: {e})")
                return None
            raise BackupError(
                f"The archive's {member.name[:200]!r} cannot be restored safely ({e}); "
                "nothing was restored."
            ) from e
        keep_attrs = {}
        if member.isdir():  # the data filter leaves folders to the umask: keep their modes
            keep_attrs["mode"] = member.mode & 0o755
        if member.name.startswith(USER_TREES):  # project files keep their owners
            keep_attrs.update(uid=member.uid, gid=member.gid, uname="", gname="")
        return safe.replace(**keep_attrs, deep=False) if keep_attrs else safe

    say("Restoring the hub's folder and the project folders...")
    umask = os.umask(0o077)
    try:
        # extractall: folders get their modes last (a read-only folder still fills)
        tar.extractall(stage, members=members, filter=keep, numeric_owner=True)
    except (OSError, tarfile.TarError, gzip.BadGzipFile) as e:
        raise BackupError(f"Could not restore the archive into {stage.parent}: {e}.") from e
    finally:
        os.umask(umask)
    return skipped


def _move_into_place(stage: Path, dest: dict[str, Path], stamp: str, tops: set[str]) -> list[str]:
    said = []
    for top in TOPS:
        if top not in tops and top != HUB:
            continue
        target = dest[top]
        target.parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(target):
            if target.is_dir() and not target.is_symlink() and not any(os.scandir(target)):
                target.rmdir()
            else:
                aside = target.with_name(f"{target.name}.before-restore-{stamp}")
                os.replace(target, aside)
                said.append(f"Moved what was at {target} to {aside}.")
        os.replace(stage / top, target)
        said.append(f"Restored {target}.")
    return said


def _summary(dest: dict[str, Path], manifest: dict, environ, say) -> None:
    hub = dest[HUB]
    try:
        db = sqlite3.connect(f"file:{hub / DATABASE}?mode=ro", uri=True)
        try:
            (users,) = db.execute("SELECT count(*) FROM users").fetchone()
            (servers,) = db.execute("SELECT count(*) FROM spawners WHERE name != ''").fetchone()
        finally:
            db.close()
        say(f"The restored hub has {users} accounts and {servers} projects.")
    except sqlite3.Error as e:
        say(f"The restored database could not be read ({e}); `gpulab up` will say more.")
    if not (hub / "crypt-key").exists() and not environ.get("JUPYTERHUB_CRYPT_KEY"):
        say(
            "This archive has no key for users' secrets (the old hub took it from "
            "JUPYTERHUB_CRYPT_KEY): set the same JUPYTERHUB_CRYPT_KEY here before `gpulab up`, "
            "or users' secrets cannot be read."
        )
    if manifest.get("projects") != "all files":
        say(
            "Project folders hold only their Dockerfiles (the backup was made without "
            "--projects): copy the projects' files from elsewhere."
        )
    say("Start the hub with: gpulab up (with the same site settings as the old one).")
