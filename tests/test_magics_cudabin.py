"""SASS/PTX architectures read from real nvcc output (no GPU needed, nvcc is)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from gpulab_jupyter.magics import cudabin

NVCC = shutil.which("nvcc")
# nvcc is on the GPU machine only: the GPU suite (`pytest -m gpu`) runs these.
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not NVCC, reason="nvcc (CUDA toolkit) is not installed here"),
]
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
    assert code.sass == {"7.5", "9.0a"}
    assert code.runs_on("9.0")
    assert not code.runs_on("10.0")  # sm_90a code runs on 9.0 only


# nvcc target -> (what the fat binary says: sass, ptx), GPUs it runs on, GPUs it does not
VARIANTS = [
    ("compute_90a:sm_90a", ({"9.0a"}, set()), ["9.0"], ["10.0", "12.0"]),
    ("compute_90a:compute_90a", (set(), {"9.0a"}), ["9.0"], ["10.0", "12.0"]),
    ("compute_100a:sm_100a", ({"10.0a"}, set()), ["10.0"], ["10.3", "12.0"]),
    ("compute_100f:sm_100f", ({"10.0f"}, set()), ["10.0", "10.3"], ["11.0", "12.0"]),
    ("compute_100f:compute_100f", (set(), {"10.0f"}), ["10.0", "10.3"], ["12.0", "12.1"]),
    ("compute_120f:sm_120f", ({"12.0f"}, set()), ["12.0", "12.1"], ["10.0"]),
    ("compute_90:compute_90", (set(), {"9.0"}), ["9.0", "10.0", "12.0"], ["8.9"]),
]


@pytest.mark.parametrize("compress", ["none", "default"])
@pytest.mark.parametrize(("gencode", "found", "runs", "not_on"), VARIANTS)
def test_arch_and_family_specific_code(tmp_path, compress, gencode, found, runs, not_on):
    """nvcc 12.9+ (family targets; --compress-mode from 12.8)."""
    src = tmp_path / "k.cu"
    src.write_text(KERNEL)
    out = tmp_path / "kv.so"
    arch_, code_ = gencode.split(":")
    cmd = [NVCC, "-shared", "-Xcompiler", "-fPIC", f"--compress-mode={compress}",
           f"-gencode=arch={arch_},code={code_}", "-o", str(out), str(src)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    elf, best = cudabin.parse_elf(str(out)), cudabin.cuda_code(str(out))
    assert (elf.sass, elf.ptx) == found, elf.describe()
    sass, ptx = found
    if cudabin.cuobjdump():  # cuda_code asked cuobjdump, which names an 'f' cubin plain
        sass = {t.removesuffix("f") for t in sass}  # (sm_100: the same code, the same rule)
    assert (best.sass, best.ptx) == (sass, ptx), best.describe()
    for code in (elf, best):
        assert [c for c in runs if code.runs_on(c)] == runs
        assert [c for c in not_on if code.runs_on(c)] == []
