"""Hosts where GPUs cannot be pinned: WSL2, whose GPU is the paravirtual /dev/dxg.

On WSL2 the Windows driver gives Linux one device node, /dev/dxg, for every GPU
(no /dev/nvidia<N>, no /dev/nvidiactl) and its user-space (libcuda.so,
libnvidia-ml.so, nvidia-smi) in /usr/lib/wsl/lib. A container given /dev/dxg sees
every GPU: gpulab cannot give a project one GPU of several, and NVML there reports
no utilisation and no per-process memory. So on such a host GPU projects share
all GPUs ("wsl2-shared"): nothing is booked, no start waits for a GPU, nothing is
reclaimed, and the spawn page, the doctor and the GPU panel say so.

:func:`detect` is pure in its one input, a file system root, so tests build a
fake tree; nothing is read at import. What a GPU project's container gets on such a
host is part of the container's spec, beside the other ways of giving GPUs
(projects/objects.py: ``wsl2_env``, ``wsl2_host_config``, ``wsl2_binds``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpulab_hub.projects.objects import DXG, WSL2_SHARED, WSL_DIR, WSL_LIB  # noqa: F401

PINNED = "pinned"
NVIDIACTL = "/dev/nvidiactl"
PROC_VERSION_MAX = 4096  # bytes of /proc/version read
HOST_ROOT = "/"  # where the hub sees this host's /dev and /usr/lib/wsl (tests move it)

# What the spawn page and the home page say of a GPU project on such a host.
SHARED_NOTE = (
    "Shared GPU (WSL2): all projects on this computer share it; gpulab cannot pin or measure it"
)
# What works and what does not (the doctor's finding, docs/gpus.md).
WORKS = "CUDA in projects (PyTorch and other CUDA code)"
DOES_NOT = (
    "a GPU of its own for each project, GPU utilisation, per-process GPU memory, "
    "reclaim of idle GPUs, GPU slices (MIG, MPS)"
)


@dataclass(frozen=True)
class GpuHost:
    """How this host's GPUs can be given to containers.

    ``mode`` is WSL2_SHARED (every GPU project shares every GPU) or PINNED (the usual
    NVIDIA device nodes: each project gets its own devices, or the host has no GPU).
    """

    mode: str = PINNED
    dxg: str = ""  # the paravirtual GPU node, where found
    lib_dir: str = ""  # the Windows driver's Linux libraries, where found
    kernel_says_wsl: bool = False  # /proc/version names Microsoft's kernel

    @property
    def shared(self) -> bool:
        return self.mode == WSL2_SHARED


def _under(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _kernel_says_wsl(root: str) -> bool:
    try:
        with open(_under(root, "/proc/version"), "rb") as f:
            text = f.read(PROC_VERSION_MAX).decode("utf-8", "replace").lower()
    except OSError:
        return False
    return "microsoft" in text


def detect(root: str = "/") -> GpuHost:
    """WSL2 shared mode when ``root``/dev/dxg exists and ``root``/dev/nvidiactl does not
    (a Linux host with NVIDIA's own nodes is pinned even if it also had /dev/dxg)."""
    kernel = _kernel_says_wsl(root)
    dxg = os.path.lexists(_under(root, DXG))
    if not dxg or os.path.lexists(_under(root, NVIDIACTL)):
        return GpuHost(kernel_says_wsl=kernel)
    lib = os.path.isdir(_under(root, WSL_LIB))
    return GpuHost(WSL2_SHARED, DXG, WSL_LIB if lib else "", kernel)
