"""The GPU half of ProjectSpawner: settings, reservation on start, release on stop.

Each project gets specific devices (by UUID) from the allocator, recorded in a
file that outlives the hub, and its container is given exactly those.
"""

from __future__ import annotations

import time
from pathlib import Path

from traitlets import Bool, HasTraits, Int, List, Unicode

from . import allocator, gpus, objects

INVENTORY_TTL = 300.0  # seconds an inventory read through NVML is reused


class GpuSettings(HasTraits):
    """Traits of the GPU side (mixed into ProjectSpawner)."""

    default_gpus = Int(
        1,
        config=True,
        help="""GPUs a project gets when its spawn request names no number, on a
        host that has GPUs (0 on hosts without). Default: 1.
        Example: ``c.ProjectSpawner.default_gpus = 0``""",
    )
    gpu_policy = Unicode(
        "exclusive",
        config=True,
        help="""How projects share GPUs: "exclusive" (one project per device) or
        "shared" (up to ``gpu_shared_cap`` projects per device). Default: exclusive.
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
        "auto",
        config=True,
        help="""How containers are given their GPUs: "runtime" (the NVIDIA
        container runtime or CDI, by device UUID), "devices" (explicit
        /dev/nvidia* nodes plus ``driver_dir`` mounted read-only, for hosts
        without the NVIDIA container toolkit), or "auto" (runtime where Docker
        has it, else devices). Default: auto.
        Example: ``c.ProjectSpawner.gpu_isolation = "devices"``""",
    )
    driver_dir = Unicode(
        "/usr/local/nvidia",
        config=True,
        help="""Host folder with the NVIDIA driver's user-space libraries (lib64/)
        and tools (bin/), mounted read-only on the "devices" path.
        Default: /usr/local/nvidia.
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
        "/srv/gpulab/hub/gpu-allocations.json",
        config=True,
        help="""File recording which project holds which device; it outlives the
        hub, so a restart neither frees a GPU in use nor double-books one.
        Default: /srv/gpulab/hub/gpu-allocations.json.
        Example: ``c.ProjectSpawner.allocations_file = "/var/lib/gpulab/gpus.json"``""",
    )


_inventory_cache: tuple[float, gpus.Inventory] | None = None


def cached_inventory() -> gpus.Inventory:
    """The host's inventory, read at most every INVENTORY_TTL seconds (blocking)."""
    global _inventory_cache
    now = time.monotonic()
    if _inventory_cache is None or now - _inventory_cache[0] > INVENTORY_TTL:
        _inventory_cache = (now, gpus.inventory())
    return _inventory_cache[1]


def policy_of(s: GpuSettings) -> allocator.Policy:
    return allocator.Policy(
        mode=s.gpu_policy,
        shared_cap=s.gpu_shared_cap,
        max_per_user=s.gpu_max_per_user,
        max_per_project=s.gpu_max_per_project,
        allowed_types=tuple(s.gpu_allowed_types),
        allow_mig=s.gpu_allow_mig,
    )


def running_projects(docker_call, prefix: str) -> set[tuple[str, str]]:
    """(owner, project) of every running project container of this hub."""
    found = set()
    for c in docker_call("containers", filters={"label": f"gpulab.instance={prefix}"}):
        labels = c.get("Labels") or {}
        found.add((labels.get("gpulab.owner", ""), labels.get("gpulab.project", "")))
    return found


def isolation_of(setting: str, docker_call) -> str:
    if setting in (objects.RUNTIME, objects.DEVICES):
        return setting
    return objects.detect_isolation(docker_call("info"))


def reserve(
    s: GpuSettings, docker_call, prefix: str, request: allocator.Request
) -> tuple[objects.GpuAssignment, list[gpus.Device]]:
    """Blocking: reserve devices for ``request`` (or release all for 0) -> assignment."""
    store = allocator.AllocationStore(Path(s.allocations_file))
    if request.count == 0 and not request.mig_profile:
        store.release(request.owner, request.project)
        return objects.GpuAssignment(), []
    inv = cached_inventory()
    if not inv.devices:
        asked = request.mig_profile or f"{request.count} GPU(s)"
        raise allocator.AllocationError(
            f"This project asks for {asked}, but {inv.problem}. Start it with 0 GPUs."
        )
    alive = running_projects(docker_call, prefix)
    devices = store.allocate(inv.devices, request, policy_of(s), alive=lambda o, p: (o, p) in alive)
    isolation = isolation_of(s.gpu_isolation, docker_call)
    if isolation == objects.DEVICES and any(d.parent_uuid for d in devices):
        store.release(request.owner, request.project)
        raise allocator.AllocationError(
            "MIG slices need the NVIDIA container runtime, which this host's Docker lacks; "
            "ask for a whole GPU instead."
        )
    if isolation == objects.NO_GPU:
        store.release(request.owner, request.project)
        raise allocator.AllocationError(
            "This host has GPUs but Docker cannot give them to containers (no NVIDIA "
            "runtime and no /dev/nvidiactl); run `gpulab doctor`."
        )
    assignment = objects.GpuAssignment(
        uuids=tuple(d.uuid for d in devices),
        minors=tuple(sorted({d.minor for d in devices})),
        isolation=isolation,
        driver_dir=s.driver_dir,
        alloc_conf=s.pytorch_cuda_alloc_conf,
    )
    return assignment, devices


def release(s: GpuSettings, owner: str, project: str) -> list[str]:
    return allocator.AllocationStore(Path(s.allocations_file)).release(owner, project)
