"""One GPU-architecture module (gpulab_contract.arch) for both sides: the doctor,
the base image and %gpu_install give the same MAX_JOBS and arch list for the
same memory, CPUs and GPUs."""

from __future__ import annotations

import importlib.util
import re

import pytest

from gpulab_contract import arch
from gpulab_hub.doctor import cuda, gpu, resources
from gpulab_hub.images import base as baseimage
from gpulab_jupyter.magics import buildenv

GIB = 2**30


def test_the_hub_has_no_table_of_its_own():
    assert importlib.util.find_spec("gpulab_hub.arch") is None
    for old in ("GENERATIONS", "JOB_GIB", "DEFAULT_JOB_GIB", "cap_key"):
        assert not hasattr(buildenv, old)
    assert not hasattr(resources, "GIB_PER_BUILD_JOB")


@pytest.mark.parametrize(
    ("memory_gib", "cpus"), [(0.5, 8), (3.9, 8), (4, 8), (10, 32), (23.5, 2), (23.5, 64), (250, 16)]
)
def test_doctor_and_gpu_install_set_the_same_max_jobs(monkeypatch, memory_gib, cpus):
    memory = int(memory_gib * GIB)
    meminfo = f"MemTotal: {2 * memory // 1024} kB\nMemAvailable: {memory // 1024} kB\n"
    doctor = resources.check_memory(meminfo, cpus)
    doctor_jobs = int(re.search(r"MAX_JOBS=(\d+)", doctor.seen).group(1))

    monkeypatch.setattr(buildenv, "available_memory", lambda: memory // 1024 * 1024)
    monkeypatch.setattr(buildenv, "cpu_count", lambda: cpus)
    h100 = buildenv.GpuReport(gpus=[buildenv.Gpu(0, "NVIDIA H100 80GB HBM3", "9.0")])
    benv = buildenv.build_env(["pytorch3d"], h100, torch_installed=True)

    assert int(benv.env["MAX_JOBS"]) == doctor_jobs == arch.max_jobs(memory, cpus)
    assert doctor_jobs == max(1, min(cpus, int(memory // (arch.JOB_GIB * GIB))))


def test_heavier_packages_get_fewer_jobs():
    assert arch.job_gib() == arch.JOB_GIB
    assert arch.job_gib(["six", "flash-attn"]) == arch.PACKAGE_JOB_GIB["flash-attn"]
    assert arch.max_jobs(64 * GIB, 32, ["flash-attn"]) < arch.max_jobs(64 * GIB, 32)
    assert arch.max_jobs(None, 6) == 6  # memory unknown: CPUs only


@pytest.mark.parametrize(
    "caps", [["9.0"], ["8.0", "9.0", "9.0"], ["8.6"], ["12.0", "8.9"], ["7.0", "10.0", "12.0"]]
)
def test_doctor_base_image_and_gpu_install_build_for_the_same_arch_list(caps):
    gpus = [gpu.Gpu(i, f"GPU {c}", cc=arch.key(c)) for i, c in enumerate(caps)]
    unset = cuda.check_build_arch_list("b", None, "2.7.1", gpus)
    doctor = re.search(r'TORCH_CUDA_ARCH_LIST="([^"]+)"', unset.fix).group(1)

    report = buildenv.GpuReport(gpus=[buildenv.Gpu(i, "GPU", c) for i, c in enumerate(caps)])
    magic = buildenv.build_env(["pytorch3d"], report, torch_installed=True, jobs=1).env
    base = baseimage.arch_env(baseimage.BaseSpec("cuda", tuple(caps)))

    assert magic["TORCH_CUDA_ARCH_LIST"] == doctor == base["TORCH_CUDA_ARCH_LIST"]
    for name in ("CMAKE_CUDA_ARCHITECTURES", "CUDAARCHS", "FLASH_ATTN_CUDA_ARCHS"):
        assert magic[name] == base[name]
    # what the doctor recommends, it accepts
    assert cuda.check_build_arch_list("b", doctor, "2.7.1", gpus).status == "ok"


def test_capabilities_and_what_runs_where():
    assert [arch.normalize(c) for c in ("9.0", "90", "sm_90", "compute_90", (9, 0))] == ["9.0"] * 5
    assert arch.normalize("sm_120") == "12.0" and arch.from_number(120) == "12.0"
    assert arch.sm("12.0") == "sm_120" and arch.generation("9.0") == "Hopper"
    with pytest.raises(ValueError):
        arch.normalize("hopper")
    assert arch.torch_cuda_arch_list(["9.0", "8.0"]) == "8.0;9.0+PTX"
    assert arch.nvcc_gencode(["8.0"]) == (
        "-gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_80,code=compute_80"
    )
    sass, ptx = arch.split_arch_list(["sm_50", "sm_80", "sm_90", "compute_90"])
    assert (sass, ptx) == ({"8.0", "9.0"}, {"9.0"})  # older than Volta: dropped
    assert arch.split_arch_list("8.0;8.6+PTX") == ({"8.0", "8.6"}, {"8.6"})
    assert arch.how_it_runs("8.6", {"8.0"}) == "native"  # same major, lower minor
    assert arch.how_it_runs("8.0", {"8.6"}) is None
    assert arch.how_it_runs("12.0", {"9.0"}, {"9.0"}) == "ptx"
    assert not arch.runs_on("9.0", {"8.0"}) and arch.runs_on("6.1", {"6.0"})  # old GPUs parse


def test_cuda_and_driver_tables():
    assert arch.min_cuda("12.0") == "12.8" and arch.min_cuda("9.0") == "11.8"
    assert arch.min_driver("12.8") == "570.26"
    assert arch.min_driver("12.7") == arch.MIN_DRIVER_FOR_CUDA["12.6"]  # newest not above
    assert arch.min_driver("10.2") is None
    assert set(arch.MIN_CUDA_FOR_ARCH) == set(arch.GENERATIONS)
