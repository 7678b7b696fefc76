"""The format versions of the hub's state files, and the one rule for reading them.

Every state file the hub keeps is of one :class:`Kind` (the table :data:`KINDS`): a
current format version and the upgrade steps from each older one (``steps[n]`` turns
a file of format ``n`` into one of ``n + 1``; pure functions of the file's JSON).
Reading a file (:meth:`Kind.upgrade`):

- no ``"version"`` (files of gpulab before formats were checked): format 1;
- an older format: the steps run in memory; the next write writes the current one;
- the current format: as it is;
- a newer format (written by a newer gpulab): :class:`NewerState`, whose words name
  the file, its format and this gpulab's, and what to do. Nothing is moved aside or
  rewritten: the file stays for the gpulab that wrote it.

The hub's folder as a whole (the database's gpulab part and everything that is not
one file: :data:`HUB_STEPS`) has one format too, in ``<hub>/gpulab-state-version``
beside the database. :func:`check_hub` (``gpulab up`` and every hub start) reads it,
runs the steps from an older one and says so in the log, writes the current one, and
refuses, with a sentence, a folder or a record file of a newer gpulab
(:func:`refuse_newer_at_start`). docs/upgrading.md says all this for admins.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from gpulab_contract import files

LOG = logging.getLogger("gpulab_hub")

Step = Callable[[dict], dict]

# The hub folder's own format (beside the database), and the steps from each older one.
VERSION_FILE = "gpulab-state-version"
HUB_FORMAT = 1
HUB_STEPS: Mapping[int, Callable[[Path], None]] = MappingProxyType({})

# How much of a file the start's check reads to learn its format (records are small;
# a larger one is read in full by its store, which bounds its own reads).
_PEEK_BYTES = 8 << 20
_MAX_FILES = 100_000  # files the start's check looks at, at most


class NewerState(Exception):
    """A state file (or the hub folder) written by a newer gpulab; ``str()`` is the
    sentence for the admin."""

    def __init__(self, path: Path | str, theirs: int, mine: int):
        self.path, self.theirs, self.mine = Path(path), theirs, mine
        super().__init__(
            f"{path} was written by a newer gpulab (format {theirs}; this gpulab reads up "
            f"to {mine}): upgrade gpulab, or restore a backup made by this version"
        )


def version_of(data: dict) -> int:
    """The format ``data`` (a state file's JSON object) says it is; ValueError if its
    ``"version"`` is no positive whole number (a damaged file)."""
    v = data.get("version", 1)
    if type(v) is not int or v < 1:
        raise ValueError(f'its "version" is {v!r}, not a format number')
    return v


@dataclass(frozen=True)
class Kind:
    """One kind of state file: its name, where it lies in the hub's folder by default
    (glob patterns relative to it, for the start's check), its current format and the
    steps from each older one (``steps[n]``: format n -> n + 1)."""

    name: str
    files: tuple[str, ...]
    current: int = 1
    steps: Mapping[int, Step] = field(default_factory=lambda: MappingProxyType({}))
    lines: bool = False  # one JSON object a line (a ledger), each of its own format

    def __post_init__(self) -> None:
        missing = [n for n in range(1, self.current) if n not in self.steps]
        if missing:
            raise ValueError(f"the {self.name} format has no step from {missing}")

    def upgrade(self, data: dict, path: Path | str) -> dict:
        """``data`` (the JSON object of the file ``path``) in the current format: older
        formats upgraded step by step; NewerState for a newer one; ValueError for a
        version that is no format number."""
        v = version_of(data)
        if v > self.current:
            raise NewerState(path, v, self.current)
        while v < self.current:
            data = self.steps[v](dict(data))
            v += 1
            data["version"] = v
        return data

    def stamp(self, body: Mapping) -> dict:
        """``body`` as a file of the current format is written."""
        return {"version": self.current, **{k: v for k, v in body.items() if k != "version"}}


# Every kind of state file the hub writes, one line each (the stores name theirs).
# A new format: raise ``current`` and add the step from the one before.
KINDS: Mapping[str, Kind] = MappingProxyType(
    {
        k.name: k
        for k in (
            Kind("sharing-policy", ("sharing.json",)),
            Kind("group-share-roles", ("group-share-roles.json",)),
            Kind("public-links", ("public-links.json",)),
            Kind("link-access", ("link-access.json",)),
            Kind("gpu-allocations", ("gpu-allocations.json",)),
            Kind("gpu-queue", ("gpu-queue.json",)),
            Kind("gpu-reclaim", ("gpu-reclaim.json",)),
            Kind("cluster-jobs", ("cluster-jobs.json",)),
            Kind("secrets", ("secrets/*.json",)),
            Kind("ssh-keys", ("ssh/keys/*.json",)),
            Kind("login-identities", ("login-identities.json",)),
            Kind("project-image", ("projects/*/*/image.json",)),
            # Lines of format 1 carry no "version" (the ledger is written a line a holding).
            Kind("gpu-usage", ("gpu-usage.jsonl",), lines=True),
        )
    }
)


def kind_of(relative: str) -> Kind | None:
    """The kind of the file at ``relative`` (a path inside the hub folder), if any."""
    for k in KINDS.values():
        if any(fnmatch.fnmatchcase(relative, p) and _depth(relative) == _depth(p) for p in k.files):
            return k
    return None


def _depth(p: str) -> int:
    return p.count("/")


def check_file(path: Path, kind: Kind) -> None:
    """NewerState if the file ``path`` is of a newer format than ``kind`` reads (a file
    that is missing, unreadable or no JSON object is its store's to repair)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
        raw = f.read(_PEEK_BYTES + 1)
    if len(raw) > _PEEK_BYTES and not kind.lines:
        return
    for text in raw[-_PEEK_BYTES:].splitlines() if kind.lines else [raw]:
        try:
            data = json.loads(text.decode("utf-8"))
            v = version_of(data) if isinstance(data, dict) else None
        except (ValueError, UnicodeDecodeError):
            continue  # damage is the store's to repair or skip
        if v is not None and v > kind.current:
            raise NewerState(path, v, kind.current)


def check_records(hub_dir: Path) -> int:
    """NewerState for the first state file in the hub folder of a newer format; how
    many state files were looked at. Links are never followed; archives of deleted
    users and projects (``deleted/``) are not state."""
    hub_dir = Path(hub_dir)
    seen = 0
    for top, dirs, names in os.walk(hub_dir, followlinks=False):
        rel_top = os.path.relpath(top, hub_dir)
        if rel_top == ".":
            dirs[:] = [d for d in dirs if d != "deleted"]
        for name in names:
            rel = name if rel_top == "." else f"{rel_top}/{name}"
            kind = kind_of(rel)
            if kind is None:
                continue
            seen += 1
            if seen > _MAX_FILES:
                return seen
            check_file(hub_dir / rel, kind)
    return seen


def formats() -> dict[str, int]:
    """The format this gpulab writes of each kind of state file, and of the hub folder
    (``"hub"``): what a backup's manifest records."""
    return {"hub": HUB_FORMAT, **{k.name: k.current for k in KINDS.values()}}


def check_formats(found, what: str) -> None:
    """NewerState where ``found`` (another gpulab's :func:`formats`, of ``what``: "an
    archive") has a newer format of a kind this gpulab knows; ValueError if it is no
    mapping of format numbers. Kinds this gpulab does not know are its files to ignore."""
    if not isinstance(found, dict):
        raise ValueError("its state formats are no mapping")
    mine = formats()
    for name, v in found.items():
        if not isinstance(name, str) or type(v) is not int or v < 1:
            raise ValueError(f"the state format {name!r}: {v!r} is no format number")
        if name in mine and v > mine[name]:
            raise NewerState(f"{what} ({name} format)", v, mine[name])


def read_hub_format(hub_dir: Path) -> int | None:
    """The hub folder's format (None: no file yet); ValueError if the file is damaged."""
    path = Path(hub_dir) / VERSION_FILE
    try:
        with open(path, "rb") as f:
            text = f.read(64).decode("ascii", "replace").strip()
    except FileNotFoundError:
        return None
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{path} holds {text!r}, not a format number")
    return int(text)


def check_hub(hub_dir: Path, log: logging.Logger | logging.LoggerAdapter | None = None) -> int:
    """Check the hub folder before the hub uses it; the format it is in now.

    A folder of a newer format, or any state file in it of a newer format: NewerState
    (nothing is changed). An older folder: the steps run and the log says so. A folder
    without the file (a new hub, or one of gpulab before formats were recorded) is of
    format 1. The current format is written to the file."""
    log = log or LOG
    hub_dir = Path(hub_dir)
    path = hub_dir / VERSION_FILE
    try:
        found = read_hub_format(hub_dir)
    except ValueError as e:
        log.error("gpulab: %s: taken as format 1 and written anew", e)
        found = 1
    if found is not None and found > HUB_FORMAT:
        raise NewerState(path, found, HUB_FORMAT)
    check_records(hub_dir)
    v = found or 1
    while v < HUB_FORMAT:
        HUB_STEPS[v](hub_dir)
        log.info("gpulab: upgraded the hub's state in %s from format %d to %d", hub_dir, v, v + 1)
        v += 1
    if found != HUB_FORMAT:
        hub_dir.mkdir(parents=True, exist_ok=True)
        files.write_atomic(path, f"{HUB_FORMAT}\n".encode(), mode=0o600)
        if found is not None:
            log.info("gpulab: the hub's state in %s is now of format %d", hub_dir, HUB_FORMAT)
    return HUB_FORMAT


def refuse_newer_at_start(hub_dir: Path) -> None:
    """:func:`check_hub` for the hub's start: a folder or file of a newer gpulab ends
    the start with its sentence (SystemExit, no traceback)."""
    try:
        check_hub(hub_dir)
    except NewerState as e:
        raise SystemExit(f"gpulab cannot start: {e}.") from None
