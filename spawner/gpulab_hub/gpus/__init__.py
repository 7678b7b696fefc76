"""The hub host's GPU inventory, read through NVML (nvitop) when asked.

No GPU, no driver: an empty inventory whose ``problem`` says why in words, so
the hub keeps working for CPU projects. NVML is loaded on the first call only.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Device:
    """An allocatable device: a whole GPU, or a MIG slice of one."""

    index: str  # "0", or "0:1" for MIG slice 1 of GPU 0
    uuid: str
    name: str
    memory_total: int  # bytes
    capability: str  # "9.0"
    mig_mode: bool = False  # the parent GPU has MIG enabled
    parent_uuid: str = ""  # set for MIG slices
    mig_profile: str = ""  # e.g. "1g.10gb" for MIG slices
    minor: int = -1  # /dev/nvidia<minor> (of the parent GPU for MIG slices)


@dataclass
class Inventory:
    devices: list[Device] = field(default_factory=list)
    driver: str = ""
    cuda: str = ""  # the newest CUDA the driver supports
    problem: str = ""  # why there are no devices, in words

    @property
    def gpus(self) -> list[Device]:
        return [d for d in self.devices if not d.parent_uuid]

    @property
    def capabilities(self) -> list[str]:
        return sorted({d.capability for d in self.devices})

    def as_dict(self) -> dict:
        return {
            "devices": [asdict(d) for d in self.devices],
            "driver": self.driver,
            "cuda": self.cuda,
            "problem": self.problem,
        }


def _mig_profile(name: str) -> str:
    # NVML names MIG devices like "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    return name.rsplit(" MIG ", 1)[1] if " MIG " in name else ""


def _minor_number(gpu) -> int:
    """The GPU's /dev/nvidia<N> number (NVML's minor number; the index if unknown)."""
    from nvitop import libnvml

    minor = libnvml.nvmlQuery("nvmlDeviceGetMinorNumber", gpu.handle)
    return minor if isinstance(minor, int) else int(gpu.index)


def inventory() -> Inventory:
    """Every GPU of this host, with MIG slices as devices of their own (where enabled)."""
    try:
        from nvitop import Device as NvDevice
        from nvitop import NVMLError
    except ImportError:
        return Inventory(problem="nvitop is not installed, so GPUs cannot be listed")
    # nvitop logs a banner when the library is missing; we say it in one line.
    logging.getLogger("nvitop.api.libnvml").setLevel(logging.CRITICAL + 1)
    try:
        gpus = NvDevice.all()
        inv = Inventory(driver=NvDevice.driver_version(), cuda=NvDevice.cuda_driver_version())
    except NVMLError as e:
        kind = type(e).__name__
        if "LibraryNotFound" in kind or "DriverNotLoaded" in kind:
            return Inventory(problem="no NVIDIA driver on this host: projects run on the CPU")
        return Inventory(problem=f"NVML could not list the GPUs ({e}): projects run on the CPU")
    if not gpus:
        inv.problem = "the NVIDIA driver sees no GPU on this host: projects run on the CPU"
    for gpu in gpus:
        major, minor = gpu.cuda_compute_capability()
        cap = f"{major}.{minor}"
        dev_minor = _minor_number(gpu)
        mig = bool(gpu.is_mig_mode_enabled())
        slices = gpu.mig_devices() if mig else []
        if not slices:
            inv.devices.append(
                Device(
                    str(gpu.index),
                    gpu.uuid(),
                    gpu.name(),
                    gpu.memory_total(),
                    cap,
                    mig,
                    minor=dev_minor,
                )
            )
        for s in slices:
            inv.devices.append(
                Device(
                    index=f"{gpu.index}:{s.mig_index}",
                    uuid=s.uuid(),
                    name=s.name(),
                    memory_total=s.memory_total(),
                    capability=cap,
                    mig_mode=True,
                    parent_uuid=gpu.uuid(),
                    mig_profile=_mig_profile(s.name()),
                    minor=dev_minor,
                )
            )
    return inv
