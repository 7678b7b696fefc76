"""``gpulab backup``: one archive of a running hub's state (see the package's doc).

The database is copied with SQLite's online backup API (a consistent copy while the hub
writes to it), or dumped with pg_dump where it is PostgreSQL (database.py); each record
file is read under its store's lock (``<name>.lock`` beside
it: jsonfile.LockedRecord and the GPU usage log; the SSH keys folder's one lock). The
archive is written to a temporary file (0600: it holds keys) and renamed into place.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from gpulab_hub import blocking, hubfiles, hubsettings, jsonfile, stateversion
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
)  # fmt: skip
from gpulab_hub.backup import version as gpulab_version
from gpulab_hub.backup.tree import Limits, Writer
from gpulab_hub.projects import safefs
from gpulab_hub.secrets import crypt
from gpulab_hub.ssh import keys as ssh_keys

MAX_RECORD = 256 << 20  # bytes of one record read under its lock (the usage log: 64 MiB)
# Left out of the hub's folder: what the hub makes again or only logs.
LEFT_OUT_NAMES = {"hub.log", "logs", "wheels", "jupyterhub.pid", "jupyterhub-proxy.pid"}
DELETED = hubsettings.DELETED  # deleted users' archives: their project folders (hostile)
SSH_LOG = "ssh/sessions.log"


@dataclass(frozen=True)
class Made:
    path: Path
    files: int
    bytes: int
    left_out: tuple[str, ...]  # the report's sentences (the first tree.MAX_SAID)
    left_out_count: int = 0  # every entry left out (each listed in the archive)
    listing_bytes: int = 0  # the member list's size, before compression


def default_name(now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    return f"gpulab-backup-{stamp}.tar.gz"


def _skip_hub(rel: str, st: os.stat_result) -> bool:
    name = rel.rpartition("/")[2]
    top = rel.partition("/")[0]
    return (
        top in LEFT_OUT_NAMES
        or top == DELETED
        or rel.startswith((DATABASE + "-", DATABASE))  # copied on its own; -journal, -wal
        or rel == SSH_LOG
        or name.endswith((".lock", ".pid"))
        or (name.startswith(".") and name.endswith(".tmp"))
    )


def _skip_to_dockerfiles(rel: str, st: os.stat_result) -> bool:
    """Without --projects: each project folder's Dockerfile, and the folders above it."""
    parts = rel.split("/")
    if parts[0].startswith("."):
        return True  # the build locks (.locks)
    if len(parts) <= 2:
        return not stat.S_ISDIR(st.st_mode)
    return len(parts) > 3 or parts[2] != "Dockerfile"


def _skip_locks(rel: str, st: os.stat_result) -> bool:
    return rel.split("/")[0].startswith(".")


class _LockedReader:
    """Reads a record file of the hub's folder under its store's lock, where it has one."""

    def __init__(self, hub_dir: Path):
        self.hub_dir = hub_dir

    def __call__(self, rel: str, dir_fd: int, name: str) -> bytes | None:
        lock = None
        if os.path.lexists(self.hub_dir / (rel + ".lock")):
            lock = (self.hub_dir / (rel + ".lock"), f"the record {rel}")
        elif rel.startswith("ssh/keys/") and os.path.lexists(
            self.hub_dir / "ssh" / "keys" / ssh_keys.LOCK
        ):
            lock = (self.hub_dir / "ssh" / "keys" / ssh_keys.LOCK, "the SSH keys record")
        if lock is None:
            return None
        try:
            with blocking.file_lock(*lock):
                return safefs.read_file(dir_fd, name, MAX_RECORD)
        except blocking.Busy as e:
            raise BackupError(f"{e} (gpulab backup waits {blocking.LOCK_TIMEOUT:g} s)") from e
        except (OSError, safefs.Refused):
            return None  # read (or left out, with a reason) the ordinary way


def database_path(config, hub_dir: Path) -> Path | None:
    """The hub's SQLite database (None: the hub uses another database server)."""
    url = config.JupyterHub.get("db_url", f"sqlite:///{hub_dir / DATABASE}")
    if not isinstance(url, str) or not url.startswith("sqlite:///"):
        return None
    return Path(url.removeprefix("sqlite:///"))


def copy_database(db: Path, dest: Path) -> None:
    """A consistent copy of the live SQLite database ``db`` (its online backup API)."""
    if not db.is_file():
        raise BackupError(
            f"There is no hub database at {db}: is GPULAB_HOME the hub's folder? (It is "
            "made at the hub's first start.)"
        )
    try:
        src = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
        try:
            dst = sqlite3.connect(dest)
            try:
                src.backup(dst)
                (check,) = dst.execute("PRAGMA integrity_check").fetchone()
            finally:
                dst.close()
        finally:
            src.close()
    except sqlite3.Error as e:
        raise BackupError(f"Could not copy the hub's database {db}: {e}.") from e
    if check != "ok":
        raise BackupError(f"The hub's database {db} is damaged ({check}); it was not backed up.")


def require_hub(home: Path, hub_dir: Path) -> None:
    """BackupError unless ``hub_dir`` holds a hub (before its configuration is read, which
    would make a key there)."""
    if not hub_dir.is_dir():
        raise BackupError(
            f"There is no hub at {home} (no {hub_dir}): set GPULAB_HOME to the hub's folder."
        )


def _open_private(path: Path) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, 0o600)


def make(
    out: Path | None,
    *,
    home: Path,
    hub_dir: Path,
    config,
    where,
    projects: bool,
    environ,
    limits: Limits | None = None,
    say=print,
) -> Made:
    """Write the archive of the hub at ``home`` (its GPULAB_HOME; ``hub_dir`` its own
    folder) to ``out``: ``config`` is the hub's (traitlets) configuration, ``where`` its
    layout (hubsettings: where projects and records live), ``environ`` its environment
    (JUPYTERHUB_CRYPT_KEY), ``limits`` what one project may put in it."""
    started = time.monotonic()
    home, hub_dir = Path(home), Path(hub_dir)
    require_hub(home, hub_dir)
    out = Path(out).absolute() if out else Path.cwd() / default_name()
    if os.path.lexists(out):
        raise BackupError(f"{out} exists already; name another file with -o.")
    if not out.parent.is_dir():
        raise BackupError(f"There is no folder {out.parent} to write {out.name} in.")
    for folder in (hub_dir, where.projects_root, home / hubfiles.CONFIG_D):
        if _inside(out, folder):
            raise BackupError(
                f"Write the archive outside {folder}, which the backup reads (it would hold "
                f"itself): for example in {home / 'backups'}."
            )
    work = Path(tempfile.mkdtemp(prefix=".gpulab-backup-", dir=out.parent))
    tmp = work / "archive.tar.gz"
    try:
        fd = _open_private(tmp)
        with os.fdopen(fd, "wb") as raw, _Listing(work / MEMBERS) as listing:
            with tarfile.open(fileobj=raw, mode="w:gz", compresslevel=6) as tar:
                w = Writer(tar, say, listing=listing.add, limits=limits or Limits())
                manifest = json.dumps(_manifest(home, projects), indent=1).encode()
                if len(manifest) > MAX_MANIFEST:  # never: it lists no members
                    raise BackupError(f"The manifest is larger than {MAX_MANIFEST} bytes.")
                w.add_bytes(MANIFEST, manifest, listed=False)
                _add_state(w, config, where, home, hub_dir, work, projects, environ, say)
                listed = listing.close(w)
                w.add_fd(MEMBERS, listed, os.fstat(listed), listed=False)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, out)
        jsonfile.fsync_dir(out.parent)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    seconds = time.monotonic() - started
    say(f"Wrote {out} ({w.files} files, {w.bytes / (1 << 20):.1f} MiB before compression, "
        f"{out.stat().st_size / (1 << 20):.1f} MiB on disk) in {seconds:.0f} s.")  # fmt: skip
    if w.left_out_count:
        said = w.over + w.left_out[:20]
        say(f"Left out ({w.left_out_count}):")
        for line in said:
            say(f"  {line}")
        more = w.left_out_count - w.over_count - len(w.left_out[:20])
        if more > 0:
            say(f"  ... and {more} more (each is named in the archive's {MEMBERS}: "
                f"tar -xOzf <archive> {MEMBERS})")  # fmt: skip
    say("The archive holds the hub's keys: keep it where only you can read it (it is 0600).")
    return Made(out, w.files, w.bytes, tuple(w.over + w.left_out), w.left_out_count, listing.size)


class _Listing:
    """The member list, one JSON line per member or entry left out, written to a file
    beside the archive as the walk goes (never kept in memory), then added last."""

    def __init__(self, path: Path):
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        self.file = open(os.open(path, flags, 0o600), "w+b")  # noqa: SIM115 - in __exit__
        self.size = 0
        self.fd = -1

    def add(self, entry: dict) -> None:
        line = json.dumps(entry, separators=(",", ":")).encode() + b"\n"
        if len(line) > MAX_LINE:  # never for a name Linux allows 64 folders deep
            name = str(entry.get("name") or entry.get("left_out"))[:200]
            raise BackupError(f"{name!r} has a name too long to list ({len(line)} bytes).")
        self.file.write(line)
        self.size += len(line)

    def close(self, w: Writer) -> int:
        """The last line (what the list holds: a list cut short is refused), and the
        list's descriptor, to be read from its start."""
        self.add({"end": True, "files": w.files, "bytes": w.bytes, "left_out": w.left_out_count})
        self.file.flush()
        self.file.seek(0)
        return self.file.fileno()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()


def _add_state(w: Writer, config, where, home, hub_dir, work, projects, environ, say) -> None:
    db = database_path(config, hub_dir)
    url = config.JupyterHub.get("db_url") if "JupyterHub" in config else None
    if db is None and database.postgresql(url):
        say(
            f"Dumping the hub's database {database.shown(url)} with pg_dump (one snapshot: "
            "the hub keeps running)..."
        )
        copy = work / database.DUMP
        database.dump(url, copy)
        fd = os.open(copy, os.O_RDONLY | os.O_CLOEXEC)
        try:
            w.add_fd(f"{HUB}/{database.DUMP}", fd, os.fstat(fd))
        finally:
            os.close(fd)
    elif db is None:
        w.leave_out(
            "the hub's database is neither SQLite nor PostgreSQL (JupyterHub.db_url): back "
            "it up with its server's own tools (mysqldump)"
        )
    else:
        say(f"Copying the hub's database {db} (SQLite's online backup: the hub keeps running)...")
        copy = work / DATABASE
        copy_database(db, copy)
        os.chmod(copy, 0o600)  # it holds password hashes and tokens
        fd = os.open(copy, os.O_RDONLY | os.O_CLOEXEC)
        try:
            w.add_fd(f"{HUB}/{DATABASE}", fd, os.fstat(fd))
        finally:
            os.close(fd)
    say(f"Adding the hub's records and keys from {hub_dir}...")
    w.add_tree(hub_dir, HUB, hostile=False, skip=_skip_hub, read_locked=_LockedReader(hub_dir))
    if environ.get(crypt.KEY_ENV):
        w.leave_out(
            f"the key of users' secrets: it is {crypt.KEY_ENV} in the hub's environment; "
            "set the same on the machine you restore to (secrets are in the archive, encrypted)"
        )
    for name, path in (
        ("records_dir", where.records_dir), ("state_root", where.state_root),
        ("allocations_file", where.allocations_file), ("queue_file", where.queue_file),
        ("usage_file", where.usage_file),
    ):  # fmt: skip
        if not _inside(path, hub_dir):
            w.leave_out(f"{path} (ProjectSpawner.{name}) lies outside {hub_dir}: copy it")
    if projects:
        say(f"Adding every project folder from {where.projects_root} (links kept as links)...")
        w.add_tree(where.projects_root, PROJECTS, hostile=True, skip=_skip_locks, unit_depth=2)
        say(f"Adding deleted accounts' and projects' archives from {hub_dir / DELETED}...")
        w.add_tree(hub_dir / DELETED, f"{HUB}/{DELETED}", hostile=True, unit_depth=1)
    else:
        say(f"Adding each project's Dockerfile from {where.projects_root}...")
        w.add_tree(where.projects_root, PROJECTS, hostile=True, skip=_skip_to_dockerfiles)
        w.leave_out("the files in project folders (only each Dockerfile): add --projects for them")
        if (hub_dir / DELETED).is_dir():
            w.leave_out(f"deleted accounts' archives in {hub_dir / DELETED} (--projects)")
    w.add_tree(home / hubfiles.CONFIG_D, CONFIG_D, hostile=False)
    if where.data_root.is_dir():
        w.leave_out(f"the shared data folders in {where.data_root} (datasets, models)")


def _inside(path: Path, folder: Path) -> bool:
    try:
        Path(os.path.abspath(path)).relative_to(os.path.abspath(folder))
    except ValueError:
        return False
    return True


def _manifest(home: Path, projects: bool) -> dict:
    return {
        "format": FORMAT,
        "gpulab": gpulab_version(),
        # The formats of the hub's state this gpulab writes (stateversion.py): restore
        # refuses an archive of newer ones even where the version number is the same.
        "state_formats": stateversion.formats(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "home": str(home),
        "projects": "all files" if projects else "Dockerfiles only",
        "contents": {
            HUB: "the hub's folder: database, keys, records, encrypted secrets",
            PROJECTS: "project folders" if projects else "each project's Dockerfile",
            CONFIG_D: "the admin's jupyterhub_config.d",
        },
        "members": MEMBERS,  # the member list, the archive's last member (one line each)
    }
