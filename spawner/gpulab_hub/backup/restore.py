"""``gpulab restore``: a hub's state from a ``gpulab backup`` archive, onto GPULAB_HOME.

The archive is read twice, as a stream (tarfile's ``r|gz``: no list of its members is
kept in memory, whatever their number). The first pass checks it before anything is
written: the manifest (an archive of a newer gpulab or a newer layout is refused), every
member against the member list (the same names, in the same order, of the listed kind,
sha256 and size; a sparse member's holes are never read), and no name may be absolute,
hold ``..`` or lie outside the folders gpulab restores. The second pass writes the
members, passed through tarfile's ``data`` filter, into a new private folder inside
GPULAB_HOME (unpack.py: from descriptors, never through a link, any name Linux allows),
which is then moved into place: ``hub``, ``projects`` and ``jupyterhub_config.d``. A link
of a user's that points outside the restored folders is left out (and named); project
files keep their owners.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import tarfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

from packaging.version import InvalidVersion, Version
from sqlalchemy import exc as sa_errors

from gpulab_hub import hubfiles, stateversion
from gpulab_hub.backup import (
    CONFIG_D,
    DATABASE,
    FORMAT,
    HUB,
    MANIFEST,
    MAX_LINE,
    MAX_MANIFEST,
    MEMBERS,
    PROJECTS,
    BackupError,
    database,
    sparse,
)  # fmt: skip
from gpulab_hub.backup import version as gpulab_version
from gpulab_hub.backup.make import DELETED
from gpulab_hub.backup.tree import shown
from gpulab_hub.backup.unpack import Unpacker

# Format 1 (older gpulab) listed every member in the manifest, which it wrote with no
# bound; it is read whole up to this size (an older restore refused past 256 MiB).
FORMAT_1_MAX_MANIFEST = 1 << 30
CHUNK = 1 << 20
TOPS = (HUB, PROJECTS, CONFIG_D)
USER_TREES = (f"{PROJECTS}/", f"{HUB}/{DELETED}/")  # where links may be (users' own)


def destinations(home: Path, hub_dir: Path, projects_root: Path) -> dict[str, Path]:
    return {HUB: hub_dir, PROJECTS: projects_root, CONFIG_D: home / hubfiles.CONFIG_D}


@contextlib.contextmanager
def _stream(archive: Path) -> Iterator[tarfile.TarFile]:
    """The archive as a stream of members (read once, front to back)."""
    if not archive.is_file():
        raise BackupError(f"There is no archive {archive}.")
    try:
        tar = tarfile.open(archive, "r|gz")
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        raise BackupError(
            f"{archive} is not a gpulab backup: it is not a .tar.gz archive ({e})."
        ) from e
    try:
        yield tar
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        raise BackupError(
            f"{archive} is not a gpulab backup, or it is damaged or cut short ({e}); "
            "nothing was restored."
        ) from e
    finally:
        tar.close()


def _members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """Each member once; tarfile's own list of them is emptied as it goes."""
    while (m := tar.next()) is not None:
        tar.members.clear()
        yield m


def read_manifest(tar: tarfile.TarFile, member: tarfile.TarInfo, archive: Path) -> dict:
    """The archive's manifest, checked: a gpulab backup of a layout and version this
    gpulab reads."""
    if not member.isreg() or member.size > FORMAT_1_MAX_MANIFEST:
        raise BackupError(f"{archive}'s {MANIFEST} is not a manifest gpulab wrote.")
    try:
        manifest = json.loads(tar.extractfile(member).read(FORMAT_1_MAX_MANIFEST + 1))
        theirs, fmt, members = manifest["gpulab"], manifest["format"], manifest["members"]
        if not isinstance(fmt, int) or not isinstance(members, dict if fmt == 1 else str):
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
    if fmt > 1 and member.size > MAX_MANIFEST:
        raise BackupError(f"{archive}'s {MANIFEST} is not a manifest gpulab wrote.")
    try:
        stateversion.check_formats(manifest.get("state_formats", {}), str(archive))
    except stateversion.NewerState as e:
        raise BackupError(f"{e}.") from e
    except ValueError as e:
        raise BackupError(f"{archive}'s {MANIFEST} is damaged ({e}); it cannot be restored.") from e
    return manifest


def _unsafe(name: str) -> bool:
    """Absolute, with ``..`` or an empty component: never restored. (A backslash is a
    character of a name on Linux like any other.)"""
    parts = name.split("/")
    return name.startswith("/") or ".." in parts or "" in parts[:-1]


def _line(entry: dict) -> bytes:
    return json.dumps(entry, separators=(",", ":")).encode() + b"\n"


def _read_lines(f, what: str) -> Iterator[dict]:
    """One JSON object per line of ``f``, each at most MAX_LINE bytes."""
    while line := f.readline(MAX_LINE + 1):
        if len(line) > MAX_LINE or not line.endswith(b"\n"):
            raise ValueError(f"{what} has a line longer than {MAX_LINE} bytes")
        entry = json.loads(line)
        if not isinstance(entry, dict):
            raise ValueError(f"{what} has a line that is not an object")
        yield entry


def unpack_checked(tar: tarfile.TarFile, archive: Path, stage: Path, say=print):
    """Read the archive once: each member checked (its name and kind) and written below
    ``stage`` (a new private folder), its sha256 taken as it is written; then the
    members compared with the member list. -> (the manifest, links left out, the top
    folders the archive has). BackupError where anything does not match: the caller
    removes ``stage``, so nothing is restored."""
    refuse = "it was changed or damaged after gpulab wrote it; nothing was restored"
    for top, mode in ((HUB, 0o700), (PROJECTS, 0o755), (CONFIG_D, 0o700), (".check", 0o700)):
        (stage / top).mkdir(mode=mode)
    os.chmod(stage / PROJECTS, 0o755)  # whatever the umask: containers' engine reaches it
    seen_path, listed_path = stage / ".check" / "seen.jsonl", stage / ".check" / "listed.jsonl"
    manifest, files, skipped, tops = None, 0, [], set()
    keep = _keeper(stage, skipped)
    root = os.open(stage, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    unpacker = Unpacker(root)
    try:
        with open(seen_path, "wb") as seen:
            for m in _members(tar):
                if m.name == MANIFEST and manifest is None:
                    manifest = read_manifest(tar, m, archive)
                    say(f"It is a backup of {manifest.get('home', '?')} made by gpulab "
                        f"{manifest['gpulab']} at {manifest.get('created', '?')}.")  # fmt: skip
                    say("Restoring the hub's folder and the project folders...")
                    continue
                if m.name == MEMBERS and manifest is not None and manifest["format"] > 1:
                    with open(listed_path, "wb") as out:
                        shutil.copyfileobj(tar.extractfile(m), out, CHUNK)
                    continue
                entry = _checked(m, archive, refuse)
                tops.add(m.name.split("/")[0])
                safe = keep(m)
                if safe is not None:
                    entry.update(unpacker.add(tar, safe))
                files += m.isreg()
                seen.write(_line(entry))
        unpacker.close()
    finally:
        unpacker.release()
        os.close(root)
    if manifest is None:
        raise BackupError(f"{archive} is not a gpulab backup: it has no {MANIFEST}.")
    with open(seen_path, "rb") as seen, contextlib.ExitStack() as stack:
        if manifest["format"] == 1:
            listed = ({"name": n, **e} if isinstance(e, dict) else {"name": n}
                      for n, e in manifest["members"].items())  # fmt: skip
        elif listed_path.exists():
            listed = _listed(stack.enter_context(open(listed_path, "rb")), archive, refuse)
        else:
            raise BackupError(f"{archive} lacks its {MEMBERS}: it is cut short; {refuse}.")
        try:
            _compare(_read_lines(seen, "the archive"), listed, archive, refuse)
        except ValueError as e:
            raise BackupError(f"{archive}'s {MEMBERS} is damaged ({e}); {refuse}.") from e
    say(f"Checked the archive: {files} files match their sha256 sums in the manifest.")
    return manifest, skipped, tops


def _listed(f, archive: Path, refuse: str) -> Iterator[dict]:
    """The member list's members (entries left out skipped); it must end with its last
    line."""
    ended = False
    for entry in _read_lines(f, MEMBERS):
        if ended:
            raise ValueError("lines after its end")
        if entry.get("end") is True:
            ended = True
        elif "left_out" not in entry:
            yield entry
    if not ended:
        raise BackupError(f"{archive}'s {MEMBERS} is cut short: {refuse}.")


def _checked(m: tarfile.TarInfo, archive: Path, refuse: str) -> dict:
    """What the manifest must say of the member ``m`` (its name and kind; a file's
    sha256 and size are added as it is written). BackupError for a name or kind gpulab
    never restores."""
    if _unsafe(m.name) or m.name.split("/")[0] not in TOPS:
        raise BackupError(
            f"{archive} holds {m.name[:200]!r}, a path outside the folders gpulab restores "
            f"(an absolute path or one with '..'): {refuse}."
        )
    kind = "file" if m.isreg() else "folder" if m.isdir() else "link" if m.issym() else "other"
    if kind == "other":
        raise BackupError(
            f"{archive} holds {m.name[:200]!r}, which is no file, folder or link (a hard "
            f"link or a device): {refuse}."
        )
    if kind == "link" and not m.name.startswith(USER_TREES):
        raise BackupError(f"{archive} holds a link {m.name[:200]!r} in the hub's folder: {refuse}.")
    if m.sparse is not None and len(m.sparse) > sparse.MAX_EXTENTS:
        raise BackupError(f"{archive}'s {m.name[:200]!r} has too many holes: {refuse}.")
    return {"name": m.name, "type": kind}


def _compare(seen: Iterator[dict], listed: Iterator[dict], archive: Path, refuse: str) -> None:
    """The archive's members and the list, in the same order, the same."""
    for got in seen:
        want = next(listed, None)
        name = got["name"]
        if want is None or want.get("name") != name or want.get("type") != got["type"]:
            raise BackupError(
                f"{archive} holds {name[:200]!r}, not as its manifest lists: {refuse}."
            )
        if got["type"] == "file" and (
            want.get("sha256") != got["sha256"] or want.get("size") != got["size"]
            or want.get("sparse") != got.get("sparse")
        ):  # fmt: skip
            raise BackupError(
                f"{archive}'s {name[:200]} does not match its sha256 in the manifest: {refuse}."
            )
    missing = [want.get("name", "?") for want in listed]
    if missing:
        raise BackupError(
            f"{archive} lacks {len(missing)} of the files its manifest lists (first: "
            f"{str(missing[0])[:200]}): it is cut short or damaged; nothing was restored."
        )


def _conflicts(dest: dict[str, Path], db_url: str) -> list[str]:
    """What a restore would replace that holds a hub's state (refused without --force)."""
    found = []
    if (dest[HUB] / DATABASE).exists():
        found.append(f"a hub database ({dest[HUB] / DATABASE})")
    if db_url and database.has_hub(db_url):
        found.append(f"a hub database ({database.shown(db_url)})")
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
    db_url = _database_url(environ)
    found = _conflicts(dest, db_url)
    if found and not force:
        raise BackupError(
            f"{home} already has a hub's state: {', '.join(found)}. Restore onto a new "
            "GPULAB_HOME, or add --force to move what is there aside (to "
            "<name>.before-restore-<time>) and restore in its place."
        )
    say(f"Reading {archive}...")
    home.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    stage = home / f".gpulab-restore-{stamp}"
    stage.mkdir(mode=0o700)
    try:
        with _stream(archive) as tar:
            manifest, skipped, tops = unpack_checked(tar, archive, stage, say)
        moved = _database_into_place(stage, db_url, home, stamp, bool(found))
        moved += _move_into_place(stage, dest, stamp, tops)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    for line in moved:
        say(line)
    for line in skipped[:20]:
        say(f"  left out: {line}")
    _summary(dest, manifest, environ, say, db_url)
    return manifest


def _database_url(environ) -> str:
    """The restoring hub's PostgreSQL database (its GPULAB_DB_URL), "" for SQLite."""
    from gpulab_hub import settings

    url = settings.parse(environ).db_url
    if url and not database.postgresql(url):
        return ""  # a SQLite file named by URL: restored as a file (its folder's)
    return url


def _database_into_place(stage: Path, db_url: str, home: Path, stamp: str, force: bool) -> list:
    """A PostgreSQL dump in the archive, into the hub's PostgreSQL database (before any
    file is moved into place); an archive of the other kind than the hub's is refused."""
    dumped = stage / HUB / database.DUMP
    if dumped.exists() and not db_url:
        raise BackupError(
            "This archive holds the hub's database as a PostgreSQL dump: set GPULAB_DB_URL "
            "to the new hub's (empty) PostgreSQL database, then restore; nothing was restored."
        )
    if not dumped.exists():
        if db_url and (stage / HUB / DATABASE).exists():
            raise BackupError(
                "This archive holds a SQLite hub database, and GPULAB_DB_URL names "
                f"PostgreSQL ({database.shown(db_url)}): restore without GPULAB_DB_URL (the "
                "hub then uses SQLite); nothing was restored."
            )
        return []
    aside = home / f"database.before-restore-{stamp}.pgdump" if force else None
    said = database.restore(db_url, dumped, aside=aside)
    dumped.unlink()  # the database has it; no copy of its hashes beside the hub
    return said


def _keeper(stage: Path, skipped: list[str]):
    """What restore writes of a member: a link as tarfile's ``data`` filter lets it (one
    of a user's that points outside is left out, named in ``skipped``; anything else it
    refuses stops the restore); files and folders with the filter's rules for modes and
    owners (below), folders keeping their modes, project files their owners."""
    where = os.fspath(stage)

    def keep(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
        users = member.name.startswith(USER_TREES)
        owner = dict(uid=member.uid, gid=member.gid, uname="", gname="") if users else {}
        if not member.issym():
            # The data filter's rules for a file's or folder's mode and owner (Python's
            # tarfile docs), applied here: the filter itself also resolves the whole name
            # on disk, an lstat per folder per member (18 s for 68,000 names 15 folders
            # deep), which _checked's name rules and the unpacker (no folder opened
            # through a link) make needless.
            mode = member.mode & 0o755  # no setuid, setgid, sticky, group or other write
            if member.isreg():
                mode = (mode if mode & 0o100 else mode & ~0o111) | 0o600
            owner = owner or dict(uid=None, gid=None, uname=None, gname=None)
            return member.replace(mode=mode, **owner, deep=False)
        try:
            safe = tarfile.data_filter(member, where)
        except tarfile.FilterError as e:
            if users:
                skipped.append(f"{shown(member.name)} (a link to {member.linkname[:200]!r}: {e})")
                return None
            raise BackupError(
                f"The archive's {member.name[:200]!r} cannot be restored safely ({e}); "
                "nothing was restored."
            ) from e
        return safe.replace(**owner, deep=False) if owner else safe

    return keep


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


def _summary(dest: dict[str, Path], manifest: dict, environ, say, db_url: str = "") -> None:
    hub = dest[HUB]
    try:
        if db_url:
            users, servers = database.counts(db_url)
        else:
            db = sqlite3.connect(f"file:{hub / DATABASE}?mode=ro", uri=True)
            try:
                (users,) = db.execute("SELECT count(*) FROM users").fetchone()
                (servers,) = db.execute(
                    "SELECT count(*) FROM spawners WHERE name != ''"
                ).fetchone()
            finally:
                db.close()
        say(f"The restored hub has {users} accounts and {servers} projects.")
    except (sqlite3.Error, sa_errors.SQLAlchemyError) as e:
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
