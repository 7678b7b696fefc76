"""The GPU half of ProjectSpawner: settings, reservation on start, release on stop.

Each project gets specific devices (by UUID) from the allocator, recorded in a
file that outlives the hub, and its container is given exactly those.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import docker.errors
from sqlalchemy.exc import SQLAlchemyError
from traitlets import Bool, Dict, Float, HasTraits, Int, List, Unicode, default

from gpulab_hub import blocking, gpus, hubsettings
from gpulab_hub.gpus import allocator, reclaim, usage, utilmeter, wsl
from gpulab_hub.hubsettings import default_layout
from gpulab_hub.layout import (
    DATABASE,
    GPU_USAGE_RETENTION_DAYS,
    GPU_USAGE_WINDOW_S,
    QUEUE,
    USAGE,
    sqlite_url,
)
from gpulab_hub.projects import objects
from gpulab_hub.settings import DEFAULT

INVENTORY_TTL = 300.0  # seconds an inventory read through NVML is reused


class GpuTraits(HasTraits):
    """Traits of the GPU side (mixed into ProjectSpawner)."""

    default_gpus = Int(
        1,
        config=True,
        help="""GPUs a project gets when its spawn request names no number, on a
        host that has GPUs (0 on hosts without). Default: 1.
        Example: ``c.ProjectSpawner.default_gpus = 0``""",
    )
    gpu_policy = Unicode(
        DEFAULT.gpus.policy,
        config=True,
        help=f"""How projects share GPUs: "exclusive" (one project per device) or
        "shared" (up to ``gpu_shared_cap`` projects per device). Default: {DEFAULT.gpus.policy}.
        Example: ``c.ProjectSpawner.gpu_policy = "shared"``""",
    )
    gpu_shared_cap = Int(
        2,
        config=True,
        help="""In shared mode, the most projects on one device. Default: 2.
        Example: ``c.ProjectSpawner.gpu_shared_cap = 4``""",
    )
    gpu_max_per_user = Int(
        None,
        allow_none=True,
        config=True,
        help="""Devices one user may hold over all their projects; None for no
        limit. Default: None. Example: ``c.ProjectSpawner.gpu_max_per_user = 2``""",
    )
    gpu_max_per_project = Int(
        None,
        allow_none=True,
        config=True,
        help="""Devices one project may ask for; None for no limit. Default: None.
        Example: ``c.ProjectSpawner.gpu_max_per_project = 1``""",
    )
    gpu_allowed_types = List(
        Unicode(),
        config=True,
        help="""GPU models a project may ask for by name (e.g. to choose between an
        A100 and an H100); empty: asking by type is not offered. Default: [].
        Example: ``c.ProjectSpawner.gpu_allowed_types = ["H100", "A100"]``""",
    )
    gpu_allow_mig = Bool(
        True,
        config=True,
        help="""Offer MIG slices (of GPUs in MIG mode) as devices of their own.
        Default: True. Example: ``c.ProjectSpawner.gpu_allow_mig = False``""",
    )
    gpu_isolation = Unicode(
        DEFAULT.gpus.isolation,
        config=True,
        help=f"""How containers are given their GPUs: "runtime" (the NVIDIA
        container runtime or CDI, by device UUID), "devices" (explicit
        /dev/nvidia* nodes plus ``driver_dir`` mounted read-only, for hosts
        without the NVIDIA container toolkit), or "auto" (runtime where Docker
        has it, else devices). Default: {DEFAULT.gpus.isolation}.
        Example: ``c.ProjectSpawner.gpu_isolation = "devices"``""",
    )
    driver_dir = Unicode(
        DEFAULT.gpus.driver_dir,
        config=True,
        help=f"""Host folder with the NVIDIA driver's user-space libraries (lib64/)
        and tools (bin/), mounted read-only on the "devices" path (site setting
        GPULAB_DRIVER_DIR). Default: {DEFAULT.gpus.driver_dir}.
        Example: ``c.ProjectSpawner.driver_dir = "/opt/nvidia-driver"``""",
    )
    pytorch_cuda_alloc_conf = Unicode(
        "expandable_segments:True",
        config=True,
        help="""PYTORCH_CUDA_ALLOC_CONF in GPU projects (less fragmentation).
        Default: expandable_segments:True.
        Example: ``c.ProjectSpawner.pytorch_cuda_alloc_conf = "max_split_size_mb:512"``""",
    )
    allocations_file = Unicode(
        str(default_layout(DEFAULT.home).allocations_file),
        config=True,
        help=f"""File recording which project holds which device; it outlives the
        hub, so a restart neither frees a GPU in use nor double-books one.
        Default: {default_layout(DEFAULT.home).allocations_file}.
        Example: ``c.ProjectSpawner.allocations_file = "/var/lib/gpulab/gpus.json"``""",
    )
    gpu_queue = Bool(
        True,
        config=True,
        help="""When no GPU fits a start, it waits in a queue (the spawn page says
        where it stands and who holds the GPUs) instead of being refused; it starts
        by itself when its turn comes. A start the host can never satisfy (more GPUs
        than it has, a type it lacks) is refused at once either way. Default: True.
        Example: ``c.ProjectSpawner.gpu_queue = False``""",
    )
    gpu_queue_max_wait = Float(
        24 * 3600.0,
        config=True,
        help="""Seconds a start waits in the GPU queue before it gives up (and says
        so on the spawn page). Keep ``Spawner.start_timeout`` above this plus the
        longest build: gpulab's settings set it to this default plus an hour.
        Default: 86400 (a day). Example: ``c.ProjectSpawner.gpu_queue_max_wait = 4 * 3600``""",
    )
    queue_file = Unicode(
        config=True,
        help="""File of the starts waiting for a GPU; it outlives the hub, so a restart
        keeps every waiting start's place.
        Default: gpu-queue.json in the folder of ``allocations_file``.
        Example: ``c.ProjectSpawner.queue_file = "/var/lib/gpulab/gpu-queue.json"``""",
    )
    usage_file = Unicode(
        config=True,
        help="""The GPU usage ledger file of gpulab before its database: imported once,
        as the hub starts on this gpulab, into the table gpulab_usage of the hub's
        database (``JupyterHub.db_url``), where every GPU holding is recorded since; the
        file is then renamed to <name>.imported, the pre-upgrade backup.
        Default: gpu-usage.jsonl in the folder of ``allocations_file``.
        Example: ``c.ProjectSpawner.usage_file = "/var/lib/gpulab/gpu-usage.jsonl"``""",
    )

    @default("queue_file")
    def _queue_file_default(self) -> str:
        return str(Path(self.allocations_file).with_name(QUEUE))

    @default("usage_file")
    def _usage_file_default(self) -> str:
        return str(Path(self.allocations_file).with_name(USAGE))

    gpu_usage_window = Float(
        GPU_USAGE_WINDOW_S,
        config=True,
        help="""Seconds of GPU use the queue's fair-share order counts (the least
        used over this window go first) and budgets are measured over.
        Default: 604800 (7 days). Example: ``c.ProjectSpawner.gpu_usage_window = 86400``""",
    )
    gpu_usage_retention_days = Float(
        GPU_USAGE_RETENTION_DAYS,
        config=True,
        help="""Days a GPU usage record is kept after its holding ended; older records
        are deleted from the hub's database (table gpulab_usage) as new ones are
        written. At least ``gpu_usage_window`` (fair share and budgets read that far
        back): a shorter one stops the hub's start with a sentence. The usage page and
        its CSV export reach back this far. Default: 90.
        Example: ``c.ProjectSpawner.gpu_usage_retention_days = 365``""",
    )
    gpu_budget_hours = Dict(
        key_trait=Unicode(),
        value_trait=Float(),
        config=True,
        help="""GPU-hour budgets over ``gpu_usage_window``: a user's name, or
        "group:<name>" for each member of a JupyterHub group (the smallest of a
        user's groups counts; a user's own entry wins), or "*" for everyone else.
        A user over budget still gets a GPU nobody else waits for, but waits after
        the others. Default: {} (no budgets).
        Example: ``c.ProjectSpawner.gpu_budget_hours = {"*": 40, "group:students": 20}``""",
    )

    gpu_reclaim_idle = Float(
        reclaim.Rules.idle_after,
        config=True,
        help="""While starts wait in the GPU queue, a project holding GPUs whose server
        reported no activity for this many seconds is warned (its home page row says
        when it stops) and, ``gpu_reclaim_grace`` later without activity, stopped, its
        files kept. A busy kernel, a running job or a busy GPU counts as activity, so
        such a project is never reclaimed. Read by the gpulab-gpu-keeper service
        (site setting GPULAB_GPU_RECLAIM_IDLE). Default: 300 (5 min).
        Example: ``c.ProjectSpawner.gpu_reclaim_idle = 1800``""",
    )
    gpu_reclaim_grace = Float(
        reclaim.Rules.grace,
        config=True,
        help="""Seconds from the reclaim warning to the stop; any activity in between
        withdraws the warning. Read by the gpulab-gpu-keeper service (site setting
        GPULAB_GPU_RECLAIM_GRACE). Default: 300 (5 min).
        Example: ``c.ProjectSpawner.gpu_reclaim_grace = 900``""",
    )
    gpu_idle_release = Float(
        1500.0,
        config=True,
        help="""Seconds a project holding GPUs may be idle in every way (no busy kernel,
        no running job, no open SSH session, GPUs unused) before it is warned and,
        ``gpu_reclaim_grace`` later without activity, stopped, its files kept, even
        when nobody waits for a GPU. 0: never (only the idle culler stops it). Read by
        the gpulab-gpu-keeper service (site setting GPULAB_GPU_IDLE_RELEASE).
        Default: 1500 (25 min; benchmarks/capacity.py shows what each setting
        buys). Example: ``c.ProjectSpawner.gpu_idle_release = 3600``""",
    )


_inventory_cache: tuple[float, gpus.Inventory] | None = None


def cached_inventory() -> gpus.Inventory:
    """The host's inventory, read at most every INVENTORY_TTL seconds (blocking)."""
    global _inventory_cache
    now = time.monotonic()
    if _inventory_cache is None or now - _inventory_cache[0] > INVENTORY_TTL:
        _inventory_cache = (now, gpus.inventory())
    return _inventory_cache[1]


def policy_of(s: GpuTraits) -> allocator.Policy:
    """The allocator's policy from the gpu_* traits (hubsettings.POLICY_TRAITS names them)."""
    fields = {f: getattr(s, t) for f, t in hubsettings.POLICY_TRAITS}
    return allocator.Policy(**{**fields, "allowed_types": tuple(fields["allowed_types"])})


# Docker states of a container that no longer runs (and will not, unless started again)
GONE_STATES = ("exited", "dead")
# Seconds a fresh reservation counts as alive although its container does not exist yet
# (the spawn may wait for a build, or the hub may have died mid-spawn). Within one hub
# process, spawns under way are known exactly (below), however long they wait.
RESERVE_GRACE = 120.0
clock = time.time  # what reservations are stamped with (tests move it)

# Spawns of this hub process that reserved GPUs, by (owner, project): the devices they
# were given. Such a holding is alive until the spawner releases it (stop, poll, a
# failed start), whether or not its container exists yet. A hub restart forgets them.
_pending: dict[tuple[str, str], tuple[str, ...]] = {}
_pending_lock = threading.Lock()


def forget_pending() -> None:
    """What a hub restart does: this process has no spawn under way."""
    with _pending_lock:
        _pending.clear()


def _log(s):
    return getattr(s, "log", None) or logging.getLogger("gpulab_hub.gpus")


def project_containers(docker_call, prefix: str) -> list[dict]:
    """Every project container of this hub that exists and is not stopped
    (created, running, paused, restarting): what may be using its GPUs."""
    listed = docker_call("containers", all=True, filters={"label": f"gpulab.instance={prefix}"})
    return [c for c in listed if c.get("State") not in GONE_STATES]


def _key(c: dict) -> tuple[str, str]:
    labels = c.get("Labels") or {}
    return labels.get("gpulab.owner", ""), labels.get("gpulab.project", "")


class Liveness:
    """``alive(owner, project)`` for the allocator, asked under its lock: a spawn of this
    process under way, or a project container that exists. Docker is asked once, when
    it is made: make it BEFORE taking the allocator's lock, which is never held while
    Docker answers (a container made after the listing belongs to a spawn under way or
    to a holding within its RESERVE_GRACE, both alive all the same)."""

    def __init__(self, docker_call, prefix: str):
        self._live = {_key(c) for c in project_containers(docker_call, prefix)}

    def __call__(self, owner: str, project: str) -> bool:
        with _pending_lock:
            if (owner, project) in _pending:
                return True
        return (owner, project) in self._live


def _gpu_ids(inspected: dict) -> set[str]:
    """The device UUIDs a container was given (its environment, its device requests)."""
    lines = (inspected.get("Config") or {}).get("Env") or []
    env = dict(e.split("=", 1) for e in lines if "=" in e)
    ids = set(env.get("NVIDIA_VISIBLE_DEVICES", "").split(","))
    for r in (inspected.get("HostConfig") or {}).get("DeviceRequests") or []:
        ids.update(r.get("DeviceIDs") or [])
    return {i.strip() for i in ids if i.strip().startswith(("GPU-", "MIG-"))}


def held_in_docker(docker_call, prefix: str) -> allocator.Held:
    """The holdings the project containers that exist (and this process's spawns under
    way) show: what a damaged or lost allocation record is rebuilt from."""
    now = clock()
    held: dict[str, tuple[allocator.Holder, ...]] = {}

    def add(uuid: str, h: allocator.Holder) -> None:
        if all(x.key != h.key for x in held.get(uuid, ())):
            held[uuid] = held.get(uuid, ()) + (h,)

    for c in project_containers(docker_call, prefix):
        owner, project = _key(c)
        if not (owner and project):
            continue
        try:
            inspected = docker_call("inspect_container", c["Id"])
        except docker.errors.NotFound:
            continue  # removed since it was listed
        created = float(c.get("Created") or now)  # its container keeps it; no grace needed
        for u in sorted(_gpu_ids(inspected)):
            add(u, allocator.Holder(owner, project, created, created))
    with _pending_lock:
        pending = dict(_pending)
    for (owner, project), uuids in pending.items():
        for u in uuids:
            add(u, allocator.Holder(owner, project, now, now))
    return held


def store_of(s: GpuTraits, docker_call=None, prefix: str = "") -> allocator.AllocationStore:
    """The allocation record; with ``docker_call``, rebuilt from Docker if damaged or lost."""
    rebuild = (lambda: held_in_docker(docker_call, prefix)) if docker_call else None

    def ended(held: allocator.Held, dead: list[tuple[str, str]]) -> None:
        for key in dead:  # their containers are gone: the holding ended now
            record_usage(s, *key, held)

    return allocator.AllocationStore(
        Path(s.allocations_file),
        clock=lambda: clock(),
        rebuild=rebuild,
        log=_log(s),
        on_dead=ended,
    )


def isolation_of(setting: str, docker_call) -> str:
    if setting in (objects.RUNTIME, objects.DEVICES):
        return setting
    return objects.detect_isolation(docker_call("info"))


def reserve(
    s: GpuTraits, docker_call, prefix: str, request: allocator.Request
) -> tuple[objects.GpuAssignment, list[gpus.Device]]:
    """Blocking: reserve devices for ``request`` (or release all for 0) -> assignment.

    The holding counts as alive from here until :func:`release` (the spawner's stop,
    poll, or failed start): other spawns never take its devices while its container
    is still to be made. A spawn without GPUs never needs the record to be readable.
    """
    key = (request.owner, request.project)
    if request.count == 0 and not request.mig_profile:
        release(s, *key, docker_call=docker_call, prefix=prefix)
        return objects.GpuAssignment(), []
    inv = cached_inventory()
    host = wsl.detect(wsl.HOST_ROOT)
    if host.shared:
        return shared_wsl2(s, request, inv, host), []
    if not inv.devices:
        asked = request.mig_profile or f"{request.count} GPU(s)"
        raise allocator.AllocationError(
            f"This project asks for {asked}, but {inv.problem}. Start it with 0 GPUs."
        )
    store = store_of(s, docker_call, prefix)
    alive = Liveness(docker_call, prefix)  # Docker lists the containers before the lock
    with store.locked():  # the holding and its "under way" mark appear together
        with _pending_lock:
            _pending[key] = ()
        try:
            devices = store.allocate(
                inv.devices, request, policy_of(s), alive=alive,
                grace=RESERVE_GRACE,
            )  # fmt: skip
        except BaseException:
            with _pending_lock:
                _pending.pop(key, None)
            raise
        with _pending_lock:
            _pending[key] = tuple(d.uuid for d in devices)
    return assign(s, docker_call, key, devices), devices


def shared_wsl2(
    s: GpuTraits, request: allocator.Request, inv: gpus.Inventory, host: wsl.GpuHost
) -> objects.GpuAssignment:
    """WSL2 (gpus/wsl.py): the project shares every GPU with every other GPU project.
    Nothing is booked, so no start waits and nothing is reclaimed; a request the host
    can never meet is refused (never queued)."""
    whole = [d for d in inv.devices if not d.parent_uuid]
    if not host.lib_dir:
        raise allocator.AllocationError(
            f"This computer is WSL2 but {wsl.WSL_LIB} is missing: install the NVIDIA "
            "driver for Windows (not inside WSL), or start the project with 0 GPUs."
        )
    if request.mig_profile:
        raise allocator.AllocationError(
            "GPU slices are not available on WSL2 (its GPU is shared by all projects): "
            "ask for a whole GPU instead."
        )
    if whole and request.count > len(whole):
        raise allocator.AllocationError(
            f"This project asks for {request.count} GPUs, but this computer has "
            f"{len(whole)}. Start it with fewer."
        )
    emit = getattr(s, "_emit", None)
    if emit is not None:
        emit(75, wsl.SHARED_NOTE, note=True)
    return objects.GpuAssignment(
        uuids=tuple(d.uuid for d in whole),
        isolation=objects.WSL2,
        driver_dir=wsl.WSL_DIR,
        alloc_conf=s.pytorch_cuda_alloc_conf,
    )


def assign(
    s: GpuTraits, docker_call, key: tuple[str, str], devices: list[gpus.Device]
) -> objects.GpuAssignment:
    """Blocking: the container's GPU settings for the devices ``key`` was given
    (by :func:`reserve`, or by the queue); releases them where Docker cannot give them."""
    isolation = isolation_of(s.gpu_isolation, docker_call)
    if isolation == objects.DEVICES and any(d.parent_uuid for d in devices):
        release(s, *key)
        raise allocator.AllocationError(
            "MIG slices need the NVIDIA container runtime, which this host's Docker lacks; "
            "ask for a whole GPU instead."
        )
    if isolation == objects.NO_GPU:
        release(s, *key)
        raise allocator.AllocationError(
            "This host has GPUs but Docker cannot give them to containers (no NVIDIA "
            "runtime and no /dev/nvidiactl); run `gpulab doctor`."
        )
    return objects.GpuAssignment(
        uuids=tuple(d.uuid for d in devices),
        minors=tuple(sorted({d.minor for d in devices})),
        isolation=isolation,
        driver_dir=s.driver_dir,
        alloc_conf=s.pytorch_cuda_alloc_conf,
    )


def release(
    s: GpuTraits, owner: str, project: str, docker_call=None, prefix: str = ""
) -> list[str]:
    """Blocking: free what the project holds (stopped, died, failed to start, CPU-only).

    Never raises for the record or Docker: a stop or a CPU-only spawn goes on, and
    the error (which names the file and what to do) is logged. With ``docker_call``
    a damaged record is repaired here; else the next GPU spawn repairs it.
    """
    with _pending_lock:
        _pending.pop((owner, project), None)
    try:
        store = store_of(s, docker_call, prefix)
        with store.locked():
            held = store.holdings()
            freed = store.release(owner, project)
    except (allocator.AllocationError, OSError, docker.errors.DockerException, blocking.Busy) as e:
        # (the record says they are held until a later look finds the container gone)
        _log(s).error("GPUs of %s/%s not released: %s", owner, project, e)
        return []
    record_usage(s, owner, project, {u: held[u] for u in freed})
    return freed


def db_url_of(s: GpuTraits, config=None) -> str:
    """The hub's database: ``JupyterHub.db_url`` of the spawner's configuration (or
    ``config``); where none is set, the SQLite file in the hub's records folder (the
    folder of ``allocations_file`` for bare GpuTraits), as the layout has it."""
    config = config if config is not None else getattr(s, "config", None)
    url = hubsettings.db_url_of(config) if config is not None else ""
    folder = getattr(s, "records_dir", None) or Path(s.allocations_file).parent
    return url or sqlite_url(Path(folder) / DATABASE)


def ledger_of(s: GpuTraits) -> usage.UsageLedger:
    """The usage ledger in the hub's database (:func:`db_url_of`)."""
    return usage.UsageLedger(
        db_url_of(s),
        clock=lambda: clock(),
        retention=float(s.gpu_usage_retention_days) * usage.DAY,
        log=_log(s),
    )


def record_usage(s: GpuTraits, owner: str, project: str, held: allocator.Held) -> None:
    """Append the holdings of (owner, project) in ``held`` that just ended to the usage
    ledger, one record per device. Never raises: a stop goes on, the error is logged."""
    now = clock()
    try:
        names = {d.uuid: allocator.label(d) for d in cached_inventory().devices}
        records = [
            usage.Record(
                owner,
                project,
                u,
                _label(names.get(u, "")),
                min(h.since, now),
                now,
                utilmeter.METER.take(owner, project, u),
            )  # fmt: skip
            for u, hs in held.items()
            for h in hs
            if h.key == (owner, project)
        ]
        ledger_of(s).append(records)
    except (usage.UsageError, OSError, ValueError, blocking.Busy, SQLAlchemyError) as e:
        _log(s).error("GPU usage of %s/%s not recorded: %s", owner, project, e)


def _label(text: str) -> str:
    """``text`` as the ledger keeps a label (its characters, its length), else ''."""
    kept = "".join(c for c in text if usage.LABEL.fullmatch(c))[:128]
    return kept if usage.LABEL.fullmatch(kept) else ""
