"""The user side's one way to NVML: gpulab's binding (``gpulab_contract.nvml``), opened here.

Every reader in a project's container goes through this module: the GPU status
sampler (:class:`gpulab_jupyter.sampler.NvmlReader`, which keeps NVML open on its
thread and reads through :mod:`gpulab_jupyter.devices`), the no-GPU diagnosis,
``%gpu_info`` and ``%gpu_install`` (``magics/buildenv.py``) and jobs
(``jobs/engine.py``). The binding, not nvidia-ml-py, to save memory in every
project container (its docstring says how much).

Nothing is loaded at import.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from gpulab_contract.nvml import (
    SONAME,
    Nvml,
    NVMLError,
    NVMLError_DriverNotLoaded,
    NVMLError_LibraryNotFound,
    NVMLError_NotSupported,
    cuda_version,
)
from gpulab_jupyter import devices

__all__ = [  # the binding's names every reader here uses, and this client's own
    "SONAME", "Nvml", "NVMLError", "NVMLError_DriverNotLoaded", "NVMLError_LibraryNotFound",
    "NVMLError_NotSupported", "cuda_version", "opened", "Gpu", "gpus", "cuda_visible",
]  # fmt: skip


@contextmanager
def opened(name: str = SONAME) -> Iterator[Nvml]:
    """NVML, loaded and initialised for one question, shut down after (NVMLError if it
    does not load). The sampler keeps its own open (:class:`gpulab_jupyter.sampler.NvmlReader`)."""
    nvml = Nvml.load(name)
    try:
        yield nvml
    finally:
        try:
            nvml.nvmlShutdown()
        except NVMLError:
            pass  # the answer is already made; a failed shutdown changes nothing


@dataclass(frozen=True)
class Gpu:
    """A whole GPU as NVML lists it here."""

    index: int  # NVML's index (PCI bus order)
    uuid: str
    name: str
    capability: tuple[int, int]  # CUDA compute capability
    memory_total: int  # bytes
    memory_used: int


def gpus(nvml: Nvml) -> list[Gpu]:
    """Every whole GPU NVML lists that this process can open, in NVML's order, with its
    compute capability and memory (NVMLError when one of those cannot be read)."""
    found = []
    for d in devices.enumerate_devices(nvml):
        if d.is_mig:
            continue
        cap = nvml.nvmlDeviceGetCudaComputeCapability(d.handle)
        mem = nvml.nvmlDeviceGetMemoryInfo(d.handle)
        found.append(Gpu(d.physical, d.uuid, d.name, cap, mem.total, mem.used))
    return found


def cuda_visible(mask: str | None, items: list, index=lambda item: item.index) -> list | None:
    """The ``items`` (each with a ``uuid``) that ``CUDA_VISIBLE_DEVICES=mask`` leaves visible,
    in the mask's order; None when the variable is unset. A token is an index
    (``index(item)``, NVML's order: CUDA's with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or one GPU
    model) or a UUID or the start of one (``GPU-``, ``MIG-``); CUDA stops at the first it
    does not know."""
    if mask is None:
        return None
    picked: list = []
    for token in (t.strip() for t in mask.split(",")):
        if not token:
            break
        if token.isdigit():
            match = [i for i in items if index(i) == int(token)]
        else:
            match = [i for i in items if i.uuid and i.uuid.startswith(token)]
        if not match:
            break
        picked += [i for i in match if i not in picked]
    return picked
