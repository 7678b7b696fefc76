"""The GPUs this kernel sees, and the build environment derived from them.

Compiled CUDA extensions must be built for the GPU that will run them
(TORCH_CUDA_ARCH_LIST and the variables CMake- and flash-attn-style builds
read), and a parallel compile must not exhaust memory (MAX_JOBS from CPUs and
free memory). Nothing here runs at import time; NVML is loaded when asked.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from gpulab_contract import arch

NVML_UNREACHABLE = "the NVIDIA driver could not be reached through NVML"
# Packages whose build imports torch, so the build must see the installed torch.
TORCH_AT_BUILD = {
    "flash-attn", "pytorch3d", "nvdiffrast", "torchmcubes", "torch-scatter", "torch-sparse",
    "torch-cluster", "torch-spline-conv", "xformers", "apex", "gsplat", "simple-knn",
    "diff-gaussian-rasterization", "causal-conv1d", "mamba-ssm", "detectron2", "mmcv", "kaolin",
    "pointnet2-ops", "natten", "tinycudann", "sageattention", "fused-ssim", "torch-points-kernels",
}  # fmt: skip


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    capability: str  # "9.0"
    memory_total: int = 0  # bytes
    memory_used: int = 0
    uuid: str = ""

    @property
    def sm(self) -> str:
        return arch.sm(self.capability)


@dataclass
class GpuReport:
    gpus: list[Gpu] = field(default_factory=list)
    driver: str = ""
    cuda: str = ""  # newest CUDA the driver supports
    problem: str = ""  # why no GPU is visible, in words

    @property
    def capabilities(self) -> list[str]:
        return sorted({g.capability for g in self.gpus}, key=arch.key)


def _visible(gpus: list[Gpu], environ) -> list[Gpu]:
    """Apply CUDA_VISIBLE_DEVICES (indices or UUIDs) to what NVML lists."""
    from ..nvml import cuda_visible

    picked = cuda_visible(environ.get("CUDA_VISIBLE_DEVICES"), gpus)
    return gpus if picked is None else picked


def _from_nvml() -> GpuReport:
    """The driver and GPUs through gpulab's NVML binding (gpulab_jupyter.nvml)."""
    from .. import nvml

    try:
        lib = nvml.Nvml.load()
    except nvml.NVMLError_LibraryNotFound:
        # NVML's own words for it (its library cannot say them: it is not there)
        return GpuReport(problem=f"{NVML_UNREACHABLE} (NVML Shared Library Not Found)")
    except nvml.NVMLError as e:
        return GpuReport(problem=f"{NVML_UNREACHABLE} ({e})")
    try:
        report = GpuReport(
            driver=lib.nvmlSystemGetDriverVersion(),
            cuda=nvml.cuda_version(lib.nvmlSystemGetCudaDriverVersion_v2()),
        )
        for g in nvml.gpus(lib):
            capability = f"{g.capability[0]}.{g.capability[1]}"
            report.gpus.append(
                Gpu(g.index, g.name, capability, g.memory_total, g.memory_used, g.uuid)
            )
        return report
    except nvml.NVMLError as e:
        return GpuReport(problem=f"NVML could not list the GPUs ({e})")
    finally:
        try:
            lib.nvmlShutdown()
        except nvml.NVMLError:
            pass  # the answer is already made


def _from_nvidia_smi() -> GpuReport | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    fields = "index,name,compute_cap,memory.total,memory.used,uuid,driver_version"
    cmd = [smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return GpuReport(problem=f"nvidia-smi did not answer ({e})")
    if done.returncode != 0:
        return GpuReport(problem="nvidia-smi failed: " + (done.stdout + done.stderr).strip()[:200])
    report = GpuReport()
    mib = 1024**2
    for row in done.stdout.strip().splitlines():
        try:
            idx, name, cap, total, used, uuid, driver = (c.strip() for c in row.split(","))
            arch.key(cap)
            gpu = Gpu(int(idx), name, cap, int(total) * mib, int(used) * mib, uuid)
        except ValueError:
            return GpuReport(problem=f"nvidia-smi gave an answer gpulab cannot read: {row!r}")
        report.driver = driver
        report.gpus.append(gpu)
    return report


def detect_gpus(environ=None) -> GpuReport:
    """The GPUs visible to this kernel; ``problem`` says why there are none."""
    environ = os.environ if environ is None else environ
    report = _from_nvml()
    if not report.gpus and report.problem:
        report = _from_nvidia_smi() or report  # gpulab's images: its stand-in says why
    report.gpus = _visible(report.gpus, environ)
    if not report.gpus and not report.problem:
        report.problem = "the NVIDIA driver lists no GPU for this container"
    return report


def arch_env(capabilities: list[str]) -> dict[str, str]:
    """The variables builds read, all from the same compute capabilities (+PTX on the highest)."""
    env = arch.build_env(capabilities)
    if env:
        env["FORCE_CUDA"] = "1"
    return env


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def cpu_count() -> int:
    """CPUs this process may use: affinity, capped by a cgroup CPU quota."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    quota, _, period = _read("/sys/fs/cgroup/cpu.max").partition(" ")
    if quota.isdigit() and period.strip().isdigit():
        cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    return max(1, cpus)


def available_memory() -> int | None:
    """Bytes a build can still use: MemAvailable, capped by the cgroup's limit (None: unknown)."""
    avail = None
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemAvailable:"):
            avail = int(line.split()[1]) * 1024
    limit, usage = _read("/sys/fs/cgroup/memory.max"), _read("/sys/fs/cgroup/memory.current")
    if limit.isdigit() and usage.isdigit():
        left = max(0, int(limit) - int(usage))
        avail = left if avail is None else min(avail, left)
    return avail


def max_jobs(names=(), cpus: int | None = None, memory: int | None = None) -> int:
    """Parallel compile jobs for these packages here (:func:`gpulab_contract.arch.max_jobs`)."""
    cpus = cpu_count() if cpus is None else cpus
    memory = available_memory() if memory is None else memory
    return arch.max_jobs(memory, cpus, names)


@dataclass
class BuildEnv:
    env: dict[str, str]  # variables for pip and for the recorded RUN line
    no_build_isolation: bool
    notes: list[str]


def build_env(names, gpus: GpuReport, torch_installed: bool, jobs=None, isolation=None):
    """The environment compiles get: arch from the visible GPUs, MAX_JOBS, isolation."""
    env = arch_env(gpus.capabilities)
    notes = []
    if not env:
        notes.append(f"No GPU to build for ({gpus.problem}): CUDA architectures are not set.")
    n = jobs or max_jobs(names)
    env["MAX_JOBS"] = str(n)
    env["CMAKE_BUILD_PARALLEL_LEVEL"] = str(n)
    if isolation is None:
        no_iso = torch_installed and any(name in TORCH_AT_BUILD for name in names)
    else:
        no_iso = not isolation
    return BuildEnv(env, no_iso, notes)
