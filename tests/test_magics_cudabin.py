"""SASS/PTX architectures read from real nvcc output (no GPU needed, nvcc is)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from gpulab_jupyter.magics import cudabin

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(not NVCC, reason="nvcc (CUDA toolkit) is not installed here")
KERNEL = """
__global__ void add_one(float *x) { x[threadIdx.x] += 1.0f; }
extern "C" int launch(float *x) { add_one<<<1, 32>>>(x); return 0; }
"""


def compile_so(tmp_path, name: str, *gencode: str):
    src = tmp_path / "k.cu"
    src.write_text(KERNEL)
    out = tmp_path / f"{name}.so"
    flags = [f"-gencode=arch={a},code={c}" for a, c in (g.split(":") for g in gencode)]
    cmd = [NVCC, "-shared", "-Xcompiler", "-fPIC", *flags, "-o", str(out), str(src)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return str(out)


def test_sass_only_for_another_gpu_is_refused(tmp_path):
    code = cudabin.parse_elf(compile_so(tmp_path, "k80", "compute_80:sm_80"))
    assert (code.sass, code.ptx) == ({"8.0"}, set())
    assert code.runs_on("8.0") and code.runs_on("8.6")
    assert not code.runs_on("9.0")  # H100: no kernel image
    assert not code.runs_on("7.5")
    assert code.describe() == "sm_80"


def test_ptx_lets_a_newer_gpu_compile_the_code(tmp_path):
    so = compile_so(
        tmp_path, "kptx", "compute_80:sm_80", "compute_86:sm_86", "compute_90:compute_90"
    )
    code = cudabin.parse_elf(so)
    assert (code.sass, code.ptx) == ({"8.0", "8.6"}, {"9.0"})
    assert code.runs_on("9.0") and code.runs_on("12.0")
    assert code.describe() == "sm_80, sm_86, PTX compute_90"


def test_compressed_and_arch_specific_cubins(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text(KERNEL)
    out = tmp_path / "kc.so"
    cmd = [NVCC, "-shared", "-Xcompiler", "-fPIC", "-Xfatbin", "-compress-all",
           "-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_75,code=sm_75",
           "-o", str(out), str(src)]  # fmt: skip
    assert subprocess.run(cmd, capture_output=True).returncode == 0
    code = cudabin.parse_elf(str(out))
    assert code.sass == {"7.5", "9.0"}
    assert code.runs_on("9.0")


def test_files_without_cuda_code(tmp_path):
    assert not cudabin.parse_elf(shutil.which("ls"))
    (tmp_path / "x.so").write_bytes(b"not an elf file at all" * 10)
    assert not cudabin.cuda_code(str(tmp_path / "x.so"))
