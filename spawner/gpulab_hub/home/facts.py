"""What the home page tells about each project that JupyterHub does not know: the
GPUs it holds (the allocator's record) and its last build (the project's image
record), and where a deleted project's files went. Blocking file reads: the page
calls :func:`projects` and :func:`archived_as` on a worker thread.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import time
from dataclasses import dataclass

from sqlalchemy.exc import SQLAlchemyError

from gpulab_contract.jobs import JOB_ID
from gpulab_hub import gpus, hubsettings, jsonfile
from gpulab_hub.gpus import allocator, queue, reclaim, reclaimrecord, usage, wsl
from gpulab_hub.images import project as projectimage
from gpulab_hub.projects import Project, safefs

LOG = logging.getLogger("gpulab.home")
JOBS_LOOKED_AT = 200  # the newest job folders a project's count looks at
INVENTORY_MAX_AGE_S = 60.0  # the host's GPUs change rarely; NVML is asked at most this often
_inventory: tuple[float, dict[str, str]] | None = None


@dataclass(frozen=True)
class Build:
    """The project's last build, as its image record tells it."""

    state: str  # "ok", "failed", "none"
    good_at: float | None = None  # epoch seconds the last good image was built

    @property
    def good_iso(self) -> str:
        if self.good_at is None:
            return ""
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.good_at))


@dataclass(frozen=True)
class Facts:
    gpus: tuple[str, ...]  # "GPU 0 (NVIDIA H100 80GB HBM3)", one per device held
    gpus_unknown: str  # why the GPUs cannot be told now ("" when they can)
    build: Build
    jobs_running: int = 0  # jobs started and not ended (meaningful while the project runs)
    gpu_waiting: bool = False  # its start waits in the GPU queue
    gpu_stops_at: float | None = None  # warned: stops then unless used (someone waits)
    gpu_idle_release: bool = False  # warned for being idle long, nobody waiting

    @property
    def reclaim_words(self) -> str:
        """The warning of a GPU holder that stops unless used, for its row."""
        if self.gpu_stops_at is None:
            return ""
        at = time.strftime("%H:%M UTC", time.gmtime(self.gpu_stops_at))
        why = (
            "this project has been idle"
            if self.gpu_idle_release
            else "someone is waiting for this GPU"
        )
        return f"{why}: this project stops at {at} unless you use it"


def _device_names() -> dict[str, str]:
    """UUID -> "GPU <index> (<name>)" of this host's devices, cached a minute."""
    global _inventory
    now = time.monotonic()
    if _inventory is None or now - _inventory[0] > INVENTORY_MAX_AGE_S:
        inv = gpus.inventory()
        _inventory = (now, {d.uuid: f"GPU {d.index} ({d.name})" for d in inv.devices})
    return _inventory[1]


def _held(where: hubsettings.Layout, owner: str) -> tuple[dict[str, list[str]], str]:
    """project -> UUIDs it holds, of ``owner``'s projects; and why not, if unreadable."""
    try:
        holdings = allocator.AllocationStore(where.allocations_file).holdings()
    except allocator.AllocationError as e:
        LOG.warning("gpulab: the home page cannot read the GPU record: %s", e)
        return {}, "unknown: the GPU record is damaged; the next GPU start repairs it"
    held: dict[str, list[str]] = {}
    for uuid, holders in sorted(holdings.items()):
        for h in holders:
            if h.owner == owner:
                held.setdefault(h.project, []).append(uuid)
    return held, ""


def _waiting(where: hubsettings.Layout, owner: str) -> set[str]:
    """``owner``'s projects whose start waits in the GPU queue."""
    if not where.queue_file.exists():
        return set()
    try:
        entries = queue.QueueStore(where.queue_file).entries()
    except (queue.QueueError, OSError) as e:
        LOG.warning("gpulab: the home page cannot read the GPU queue: %s", e)
        return set()
    return {e.project for e in entries if e.owner == owner}


def _stops(where: hubsettings.Layout, owner: str) -> dict[str, reclaimrecord.Warning]:
    """``owner``'s projects warned that they stop unless used: when, and why."""
    try:
        return reclaimrecord.warnings_of(where.allocations_file, owner)
    except (jsonfile.RecordError, OSError) as e:
        LOG.warning("gpulab: the home page cannot read the GPU reclaim record: %s", e)
        return {}


def _build(where: hubsettings.Layout, owner: str, name: str) -> Build:
    project = Project(where.projects_root, owner, name, where.state_root)
    good = projectimage.last_good(project, repo=where.image_repo)
    if projectimage.last_build_failed(project):
        return Build("failed", good.built_at if good else None)
    if good is not None:
        return Build("ok", good.built_at)
    return Build("none")


def jobs_running(project: Project) -> int:
    """Jobs of the project started and not ended: a folder ``jobs/<id>/`` with a
    ``state.json`` and no ``result.json``. The project folder is the user's, so it is
    read as hostile: one folder at a time, no link followed, at most JOBS_LOOKED_AT."""
    try:
        root = safefs.open_project(project)
    except (safefs.Refused, OSError):
        return 0
    try:
        jobs = safefs.open_dirs(root, ["jobs"])
    except (safefs.Refused, OSError):
        os.close(root)
        return 0
    os.close(root)
    try:
        ids = sorted(
            (name for name, kind in safefs.entries(jobs, safefs.Budget(10_000, "jobs"))
             if kind == "folder" and JOB_ID.fullmatch(name)),
            reverse=True,
        )[:JOBS_LOOKED_AT]  # fmt: skip
        running = 0
        for job_id in ids:
            names = {"state.json": False, "result.json": False}
            for name in names:
                try:
                    st = os.stat(f"{job_id}/{name}", dir_fd=jobs, follow_symlinks=False)
                    names[name] = stat.S_ISREG(st.st_mode)
                except OSError:
                    pass
            running += names["state.json"] and not names["result.json"]
        return running
    except (safefs.Refused, OSError):
        return 0
    finally:
        os.close(jobs)


def projects(
    where: hubsettings.Layout, owner: str, names: list[str], running: tuple[str, ...] = ()
) -> dict[str, Facts]:
    """Blocking: the facts of ``owner``'s projects ``names`` (jobs counted for the
    ``running`` ones)."""
    held, unknown = _held(where, owner)
    waiting = _waiting(where, owner)
    stops = _stops(where, owner)
    devices = _device_names() if held else {}
    return {
        name: Facts(
            gpus=tuple(
                devices.get(u, f"a GPU not seen on this host now ({u})") for u in held.get(name, ())
            ),
            gpus_unknown=unknown,
            build=_build(where, owner, name),
            jobs_running=jobs_running(Project(where.projects_root, owner, name))
            if name in running
            else 0,
            gpu_waiting=name in waiting,
            gpu_stops_at=stops[name].stops_at if name in stops else None,
            gpu_idle_release=name in stops and stops[name].reason == reclaim.IDLE,
        )
        for name in names
    }


def archived_as(where: hubsettings.Layout, owner: str, project: str) -> str:
    """Blocking: the archive folder (``deleted/<owner>-<time>``) that holds the deleted
    project's files, the newest; "" when none does (not archived, or removed)."""
    root = where.deleted_dir
    pattern = re.compile(re.escape(owner) + r"-(\d{8}T\d{6}Z)(?:-(\d+))?")
    try:
        names = [p.name for p in root.iterdir()]
    except FileNotFoundError:
        return ""
    found = []
    for name in names:
        m = pattern.fullmatch(name)
        if m and (root / name / "projects" / project).is_dir():
            found.append(((m.group(1), int(m.group(2) or 1)), name))
    return f"{hubsettings.DELETED}/{max(found)[1]}" if found else ""


def gpu_use(where: hubsettings.Layout, owner: str, groups: list[str]) -> str:
    """Blocking: the user's own GPU use over the budget window, e.g. "GPU this week: 6.2 h
    of 20 h" (holdings under way counted); "" on a host without GPUs where the user has
    never held one; on WSL2 that its GPU is shared and unmeasured (gpus/wsl.py).
    ``groups``: the user's JupyterHub groups (for group budgets)."""
    from gpulab_hub.usagepage import report

    if wsl.detect(wsl.HOST_ROOT).shared:  # nothing is booked or measured there
        return wsl.SHARED_NOTE

    try:
        held = allocator.AllocationStore(where.allocations_file).holdings()
    except allocator.AllocationError as e:
        LOG.warning("gpulab: the home page cannot read the GPU record: %s", e)
        held = {}
    ledger = usage.of_layout(where)
    try:
        hours = ledger.hours_by_user(where.usage_window, held=held).get(owner)
        if hours is None and not _device_names():
            if owner not in ledger.owners():
                return ""
    except SQLAlchemyError as e:
        LOG.warning("gpulab: the home page cannot read the GPU usage ledger: %s", e)
        return ""
    budgets = report.budgets_of(where, {g: [owner] for g in groups})
    return budgets.words(owner, hours or 0.0, report.window_words(where.usage_window))
