"""Which GPUs belong to this container, and what NVML says about them.

Everything here runs on the sampler thread. ``nvml`` is an initialised
:class:`gpulab_jupyter.nvml.Nvml` (or the ``pynvml`` module, which has the same
names), passed in by the sampler; nothing is
imported or initialised at import time. The choice of devices
(:func:`select`) is a pure function of the enumerated devices and the
environment, so it is tested without a GPU.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

# NVIDIA_VISIBLE_DEVICES values that give a container no GPU (NVIDIA container toolkit).
NO_GPU_VALUES = {"void", "none", ""}
_MIG_INDEX = re.compile(r"^(\d+):(\d+)$")
# WSL2 (gpulab_hub/gpus/wsl.py): the container's GPU is the paravirtual /dev/dxg, which
# every GPU project shares, and NVML there gives no utilisation or per-process memory.
WSL2_SHARED = "wsl2-shared"
WSL2_WORDS = "shared GPU (WSL2) — utilisation not available"


@dataclass
class Device:
    """One GPU or MIG slice of this container, as NVML enumerates it."""

    nvml_index: str  # "3", or "3:1" for MIG slice 1 of GPU 3
    uuid: str
    name: str
    handle: object = None
    parent: object = None  # the physical GPU's handle, for a MIG slice
    parent_uuid: str | None = None
    mig_enabled: bool = False  # a physical GPU in MIG mode (its slices are the devices)
    minor: int | None = None  # /dev/nvidia<minor>
    memory_total: int | None = None
    power_limit: float | None = None  # W
    unsupported: set[str] = field(default_factory=set)

    @property
    def is_mig(self) -> bool:
        return self.parent_uuid is not None

    @property
    def physical(self) -> int:
        return int(self.nvml_index.split(":")[0])


class Selection:
    """The devices chosen for this container, or why there are none."""

    def __init__(self, devices: list[Device], reason: str | None = None, message: str = ""):
        self.devices = devices
        self.reason = reason
        self.message = message


def sharing_of(root: str = "/") -> dict | None:
    """How this container's GPU is shared, for the GPU panel: ``{"mode", "words"}`` on
    WSL2 (``root``/dev/dxg without ``root``/dev/nvidiactl), else None (its own GPUs)."""
    dev = os.path.join(root, "dev")
    if not os.path.lexists(os.path.join(dev, "dxg")):
        return None
    if os.path.lexists(os.path.join(dev, "nvidiactl")):
        return None
    return {"mode": WSL2_SHARED, "words": WSL2_WORDS}


def _matches(token: str, dev: Device) -> bool:
    token = token.strip()
    return bool(token) and (dev.uuid == token or dev.uuid.startswith(token))


def select(
    devices: list[Device], nvidia_visible: str | None, cuda_uuids: list[str] | None = None
) -> Selection:
    """Pick this container's devices from every device NVML enumerates.

    ``nvidia_visible`` is NVIDIA_VISIBLE_DEVICES (None when unset: no limit).
    A GPU in MIG mode stands for its slices. ``cuda_uuids`` is what
    CUDA_VISIBLE_DEVICES resolves to (None when unset), and narrows further.
    """
    physical = [d for d in devices if not d.is_mig]
    slices = {p.uuid: [d for d in devices if d.parent_uuid == p.uuid] for p in physical}

    def expand(gpu: Device) -> list[Device]:
        return slices[gpu.uuid] if gpu.mig_enabled and slices[gpu.uuid] else [gpu]

    everything = [d for gpu in physical for d in expand(gpu)]
    if nvidia_visible is None or nvidia_visible.strip().lower() == "all":
        chosen = everything
    elif nvidia_visible.strip().lower() in NO_GPU_VALUES:
        return Selection(
            [],
            "none_allocated",
            f"No GPU is allocated to this container (NVIDIA_VISIBLE_DEVICES={nvidia_visible!r}).",
        )
    else:
        tokens = [t.strip() for t in nvidia_visible.split(",") if t.strip()]
        by_index = len(physical) > len(tokens)  # else the runtime already filtered
        chosen = []
        for token in tokens:
            mig = _MIG_INDEX.match(token)
            if token.isdigit():
                picked = [g for g in physical if by_index and g.physical == int(token)]
                picked = [d for g in picked for d in expand(g)] if by_index else everything
            elif mig:
                picked = [d for d in devices if d.nvml_index == f"{mig[1]}:{mig[2]}"]
            else:
                picked = [d for g in physical if _matches(token, g) for d in expand(g)]
                picked += [d for d in devices if d.is_mig and _matches(token, d)]
            chosen += [d for d in picked if d not in chosen]
    if cuda_uuids is not None:
        wanted = set(cuda_uuids)
        chosen = [d for d in chosen if d.uuid in wanted or d.parent_uuid in wanted]
    if not chosen:
        env = f"NVIDIA_VISIBLE_DEVICES={nvidia_visible!r}"
        if cuda_uuids is not None:
            env += " and CUDA_VISIBLE_DEVICES"
        return Selection([], "none_allocated", f"No GPU is allocated to this container ({env}).")
    return Selection(chosen)


def _call(nvml, default, fn, *args):
    try:
        return getattr(nvml, fn)(*args)
    except nvml.NVMLError:
        return default


def enumerate_devices(nvml) -> list[Device]:
    """Every GPU NVML sees, and the MIG slices of those in MIG mode."""
    found = []
    for i in range(nvml.nvmlDeviceGetCount()):
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(i)
        except nvml.NVMLError:
            continue  # e.g. a GPU this container has no device node for
        gpu = Device(str(i), _call(nvml, f"GPU-{i}", "nvmlDeviceGetUUID", h), "", h)
        gpu.name = _call(nvml, "NVIDIA GPU", "nvmlDeviceGetName", h)
        gpu.minor = _call(nvml, None, "nvmlDeviceGetMinorNumber", h)
        mode = _call(nvml, (0, 0), "nvmlDeviceGetMigMode", h)
        gpu.mig_enabled = mode[0] == nvml.NVML_DEVICE_MIG_ENABLE
        found.append(gpu)
        if not gpu.mig_enabled:
            continue
        for j in range(_call(nvml, 0, "nvmlDeviceGetMaxMigDeviceCount", h)):
            mh = _call(nvml, None, "nvmlDeviceGetMigDeviceHandleByIndex", h, j)
            if mh is None:
                continue
            uuid = _call(nvml, f"MIG-{i}-{j}", "nvmlDeviceGetUUID", mh)
            name = _call(nvml, gpu.name + " MIG", "nvmlDeviceGetName", mh)
            found.append(Device(f"{i}:{j}", uuid, name, mh, h, gpu.uuid, minor=gpu.minor))
    return found


def describe(nvml, dev: Device) -> None:
    """Fill in what does not change while the server runs."""
    mem = _call(nvml, None, "nvmlDeviceGetMemoryInfo", dev.handle)
    dev.memory_total = mem.total if mem is not None else None
    limit = _call(nvml, None, "nvmlDeviceGetEnforcedPowerLimit", dev.parent or dev.handle)
    dev.power_limit = limit / 1000 if limit is not None else None


def _read(nvml, dev: Device, key: str, fn: str, *args):
    """One NVML call; a field the device does not support is not asked again."""
    if key in dev.unsupported:
        return None
    try:
        return getattr(nvml, fn)(*args)
    except nvml.NVMLError_NotSupported:
        dev.unsupported.add(key)
    except nvml.NVMLError:
        pass
    return None


def read_fast(nvml, dev: Device) -> dict:
    """The cheap fields, read every tick. Values NVML cannot give are None."""
    h, whole = dev.handle, dev.parent or dev.handle
    util = _read(nvml, dev, "util", "nvmlDeviceGetUtilizationRates", h)
    mem = _read(nvml, dev, "mem", "nvmlDeviceGetMemoryInfo", h)
    temp = _read(nvml, dev, "temp", "nvmlDeviceGetTemperature", whole, nvml.NVML_TEMPERATURE_GPU)
    power = _read(nvml, dev, "power", "nvmlDeviceGetPowerUsage", whole)
    return {
        "utilization": util.gpu if util is not None else None,
        "memory_utilization": util.memory if util is not None else None,
        "memory_used": mem.used if mem is not None else None,
        "memory_total": mem.total if mem is not None else dev.memory_total,
        "memory_free": mem.free if mem is not None else None,
        "temperature": temp,
        "power_draw": power / 1000 if power is not None else None,
        "power_limit": dev.power_limit,
    }


def read_slow(nvml, dev: Device, pcie: bool, energy: bool) -> dict:
    """PCIe throughput (about 20 ms a call) and energy (about 3 ms): off unless configured."""
    out = {}
    if pcie and not dev.is_mig:
        tx = _read(nvml, dev, "pcie", "nvmlDeviceGetPcieThroughput", dev.handle, 0)
        rx = _read(nvml, dev, "pcie", "nvmlDeviceGetPcieThroughput", dev.handle, 1)
        out["pcie_tx"] = tx * 1024 if tx is not None else None  # NVML gives KB/s
        out["pcie_rx"] = rx * 1024 if rx is not None else None
    if energy and not dev.is_mig:
        mj = _read(nvml, dev, "energy", "nvmlDeviceGetTotalEnergyConsumption", dev.handle)
        out["energy"] = mj / 1000 if mj is not None else None  # J since the driver loaded
    return out


def gpu_processes(nvml, dev: Device) -> list[tuple[int, int | None]]:
    """(PID as the driver reports it, GPU memory in bytes or None) of every process on ``dev``."""
    seen: dict[int, int | None] = {}
    for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        for p in _read(nvml, dev, fn, fn, dev.handle) or []:
            # A process with a compute and a graphics context is listed twice, same figure.
            known = seen.get(p.pid)
            used = p.usedGpuMemory
            seen[p.pid] = max(known or 0, used) if used is not None else known
    return list(seen.items())
