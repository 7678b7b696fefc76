"""The hub host's GPU inventory, read through NVML (``gpulab_hub.gpus.nvml``) when asked.

No GPU, no driver: an empty inventory whose ``problem`` says why in words, so
the hub keeps working for CPU projects. NVML is loaded on the first call only.
"""

from __future__ import annotations

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


def inventory() -> Inventory:
    """Every GPU of this host, with MIG slices as devices of their own (where enabled)."""
    from gpulab_hub.gpus import nvml

    return nvml.inventory()
