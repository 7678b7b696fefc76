"""The hub's one way to NVML: gpulab's binding (``gpulab_contract.nvml``), opened once.

Every hub reader goes through this module: the GPU inventory (:func:`inventory`,
which ``gpulab_hub.gpus.inventory`` returns and the spawner, the pages, the CLI and
the doctor read) and the utilisation meter (:func:`utilisation`). NVML is loaded
and initialised on the first call and kept for the hub process's life (as NVML's
own tools do: initialising it can take a second on a host of many GPUs); a host
without a driver is asked again on the next call, so a driver installed later is
found. Nothing is loaded at import. Calls block: pages and the event loop reach
them through the caches and threads that already wrap them.
"""

from __future__ import annotations

import logging
import threading

from gpulab_contract.nvml import (
    SONAME,
    Nvml,
    NVMLError,
    NVMLError_DriverNotLoaded,
    NVMLError_LibraryNotFound,
    cuda_version,
)
from gpulab_hub.gpus import Device, Inventory

__all__ = [  # the binding's names hub readers use, and this client's own
    "SONAME", "Nvml", "NVMLError", "NVMLError_DriverNotLoaded", "NVMLError_LibraryNotFound",
    "cuda_version", "loaded", "inventory", "utilisation",
]  # fmt: skip
LOG = logging.getLogger("gpulab.gpus")
NO_DRIVER = "no NVIDIA driver on this host: projects run on the CPU"
NO_GPU = "the NVIDIA driver sees no GPU on this host: projects run on the CPU"
MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE

_lock = threading.Lock()
_nvml: Nvml | None = None


def loaded(library: str = SONAME) -> Nvml:
    """The hub process's NVML, loaded from ``library`` the first time (NVMLError if it
    does not load: tried again on the next call)."""
    global _nvml
    with _lock:
        if _nvml is None:
            _nvml = Nvml.load(library)
        return _nvml


def _mig_profile(name: str) -> str:
    # NVML names MIG devices like "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    return name.rsplit(" MIG ", 1)[1] if " MIG " in name else ""


def _minor_number(nvml: Nvml, handle, index: int) -> int:
    """The GPU's /dev/nvidia<N> number (NVML's minor number; the index if unknown)."""
    try:
        return nvml.nvmlDeviceGetMinorNumber(handle)
    except NVMLError:
        return index


def _mig_enabled(nvml: Nvml, handle) -> bool:
    try:
        return nvml.nvmlDeviceGetMigMode(handle)[0] == MIG_ENABLED
    except NVMLError:  # not a MIG-capable GPU
        return False


def _slices(nvml: Nvml, handle) -> list[tuple[int, object]]:
    """(MIG index, handle) of each MIG device of a GPU in MIG mode."""
    found = []
    try:
        count = nvml.nvmlDeviceGetMaxMigDeviceCount(handle)
    except NVMLError:
        return found
    for j in range(count):
        try:
            found.append((j, nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)))
        except NVMLError:
            continue  # no MIG device at this index
    return found


def inventory(library: str = SONAME) -> Inventory:
    """Every GPU of this host, with MIG slices as devices of their own (where enabled);
    without a driver, an empty inventory whose ``problem`` says why."""
    try:
        nvml = loaded(library)
        inv = Inventory(
            driver=nvml.nvmlSystemGetDriverVersion(),
            cuda=cuda_version(nvml.nvmlSystemGetCudaDriverVersion_v2()),
        )
        count = nvml.nvmlDeviceGetCount()
        for i in range(count):
            inv.devices += _devices_of(nvml, i)
    except (NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded):
        return Inventory(problem=NO_DRIVER)
    except NVMLError as e:
        return Inventory(problem=f"NVML could not list the GPUs ({e}): projects run on the CPU")
    if not count:
        inv.problem = NO_GPU
    return inv


def _devices_of(nvml: Nvml, i: int) -> list[Device]:
    """GPU ``i`` as a device, or its MIG slices where it is in MIG mode and has some."""
    h = nvml.nvmlDeviceGetHandleByIndex(i)
    uuid, name = nvml.nvmlDeviceGetUUID(h), nvml.nvmlDeviceGetName(h)
    major, minor = nvml.nvmlDeviceGetCudaComputeCapability(h)
    cap = f"{major}.{minor}"
    dev_minor = _minor_number(nvml, h, i)
    mig = _mig_enabled(nvml, h)
    slices = _slices(nvml, h) if mig else []
    if not slices:
        total = nvml.nvmlDeviceGetMemoryInfo(h).total
        return [Device(str(i), uuid, name, total, cap, mig, minor=dev_minor)]
    devices = []
    for j, s in slices:
        slice_name = nvml.nvmlDeviceGetName(s)
        devices.append(
            Device(
                index=f"{i}:{j}",
                uuid=nvml.nvmlDeviceGetUUID(s),
                name=slice_name,
                memory_total=nvml.nvmlDeviceGetMemoryInfo(s).total,
                capability=cap,
                mig_mode=True,
                parent_uuid=uuid,
                mig_profile=_mig_profile(slice_name),
                minor=dev_minor,
            )
        )
    return devices


def utilisation() -> dict[str, float | None]:
    """Blocking: each GPU's utilisation now (percent, None where NVML cannot measure it);
    {} without NVML."""
    try:
        nvml = loaded()
        out: dict[str, float | None] = {}
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            try:
                util = float(nvml.nvmlDeviceGetUtilizationRates(h).gpu)
            except NVMLError:  # not measured: a GPU in MIG mode, WSL2
                util = None
            out[nvml.nvmlDeviceGetUUID(h)] = util
        return out
    except NVMLError as e:
        LOG.debug("GPU utilisation not read: %s", e)
        return {}
