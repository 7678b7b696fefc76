"""The magics on a real NVIDIA GPU (run on a GPU host: ``pytest -m gpu``).

A tiny torch CUDA extension built for another architecture only is refused,
naming this GPU's; built here (the build environment %gpu_install sets), it is
recorded. Skips, saying why, where there is no NVIDIA driver, no torch, or no nvcc.
"""

from __future__ import annotations

import shlex
import subprocess
import textwrap
import time

import pytest
from magics_kit import Kernel, autoload_like_the_image, build_sdist, make_venv, pip_env

from gpulab_jupyter.magics import buildenv

pytestmark = pytest.mark.gpu

SETUP = textwrap.dedent(
    """
    from setuptools import setup
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    setup(
        name="tiny-cuda-ext",
        version="1.0",
        packages=["tiny_cuda_ext"],
        ext_modules=[CUDAExtension("tiny_cuda_ext._C", ["csrc/add.cu"])],
        cmdclass={"build_ext": BuildExtension},
    )
    """
)
KERNEL = textwrap.dedent(
    """
    #include <torch/extension.h>
    #include <c10/cuda/CUDAException.h>

    __global__ void add_one_kernel(float *x, int64_t n) {
      int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
      if (i < n) x[i] += 1.0f;
    }

    void add_one(torch::Tensor x) {
      TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat, "a float CUDA tensor");
      int64_t n = x.numel();
      add_one_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), n);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }

    PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("add_one", &add_one); }
    """
)
CHECK = (
    "import torch, tiny_cuda_ext; x = torch.zeros(1000, device='cuda'); "
    "tiny_cuda_ext.add_one(x); torch.cuda.synchronize(); assert x.sum().item() == 1000"
)


@pytest.fixture(scope="module")
def gpu():
    report = buildenv.detect_gpus()
    if not report.gpus:
        pytest.skip(f"no NVIDIA GPU: {report.problem}")
    return report


@pytest.fixture(scope="module")
def lab(gpu, tmp_path_factory):
    root = tmp_path_factory.mktemp("magics-gpu")
    venv = root / "venv"
    python = make_venv(venv)
    autoload_like_the_image(venv)
    probe = subprocess.run(
        [str(python), "-c", "import torch.utils.cpp_extension as c; print(c.CUDA_HOME or '')"],
        capture_output=True, text=True,
    )  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(f"torch is not importable here: {probe.stderr.strip()[-200:]}")
    project = root / "project"
    project.mkdir()
    env = pip_env()
    env.update(GPULAB_PROJECT_DIR=str(project), GPULAB_ENV_SINCE=str(time.time()))
    kernel = Kernel(venv, env)
    yield {"root": root, "python": python, "project": project, "kernel": kernel,
           "cuda_home": probe.stdout.strip()}  # fmt: skip
    kernel.close()


@pytest.fixture(autouse=True)
def fresh_dockerfile(lab):
    from magics_kit import new_dockerfile

    new_dockerfile(lab["project"])


def test_gpu_info_names_the_capability_and_bf16(lab, gpu):
    out = lab["kernel"].run("%gpu_info")
    assert out["status"] == "ok", out
    first = gpu.gpus[0]
    assert f"compute capability {first.capability} ({first.sm}" in out["stdout"]
    if "H100" in first.name or "H200" in first.name:
        assert "compute capability 9.0 (sm_90, Hopper), bf16: yes" in out["stdout"]
    assert f"runs on GPU 0 ({first.sm}): yes" in out["stdout"]
    assert "NVIDIA driver" in out["stdout"]


@pytest.fixture(scope="module")
def extension(lab):
    if not lab["cuda_home"]:
        pytest.skip("no CUDA compiler (nvcc) here: torch.utils.cpp_extension finds no CUDA_HOME")
    src = lab["root"] / "src" / "tiny-cuda-ext-1.0"
    (src / "csrc").mkdir(parents=True)
    (src / "tiny_cuda_ext").mkdir()
    (src / "setup.py").write_text(SETUP)
    (src / "csrc" / "add.cu").write_text(KERNEL)
    (src / "tiny_cuda_ext" / "__init__.py").write_text("import torch\nfrom ._C import add_one\n")
    (src / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: tiny-cuda-ext\nVersion: 1.0\n")
    sdists = lab["root"] / "sdists"
    sdists.mkdir()
    build_sdist(src, sdists)
    return src, sdists


def test_extension_built_for_another_architecture_is_refused(lab, gpu, extension):
    src, _ = extension
    cap = gpu.gpus[0].capability
    wrong = "8.0" if not cap.startswith("8.") else "9.0"
    wrong_wheels = lab["root"] / "wrong-arch"
    env = {**pip_env(), "TORCH_CUDA_ARCH_LIST": wrong, "MAX_JOBS": "4"}
    cmd = [str(lab["python"]), "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
           "--no-index", "-w", str(wrong_wheels), str(src)]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    said = done.stdout + done.stderr
    if done.returncode != 0 and ("No module named 'setuptools'" in said or "bdist_wheel" in said):
        pytest.skip("setuptools (with bdist_wheel) is not installed next to torch")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    dockerfile = (lab["project"] / "Dockerfile").read_bytes()
    out = lab["kernel"].run(
        f"%gpu_install --no-index --find-links {wrong_wheels} tiny-cuda-ext", timeout=900
    )
    assert out["status"] == "error", out
    sm = gpu.gpus[0].sm
    assert f"has no code for this GPU ({sm}, compute capability {cap})" in out["stderr"]
    assert f"carries sm_{wrong.replace('.', '')} only" in out["stderr"]
    assert "no kernel image is available" in out["stderr"]
    assert (lab["project"] / "Dockerfile").read_bytes() == dockerfile
    gone = lab["kernel"].run(
        "import importlib.util; print(importlib.util.find_spec('tiny_cuda_ext'))"
    )
    assert gone["stdout"].strip() == "None"


def test_extension_built_here_is_verified_and_recorded(lab, gpu, extension):
    _, sdists = extension
    out = lab["kernel"].run(
        f"%gpu_install --no-index --find-links {sdists} --no-build-isolation "
        f'--check "{CHECK}" tiny-cuda-ext',
        timeout=1800,
    )
    assert out["status"] == "ok", out
    caps = gpu.capabilities
    arch = ";".join(caps[:-1] + [caps[-1] + "+PTX"])
    assert "runs on this GPU" in out["stdout"]
    assert "the --check code ran" in out["stdout"]
    text = (lab["project"] / "Dockerfile").read_text()
    line = next(ln for ln in text.splitlines() if "tiny-cuda-ext==1.0" in ln)
    assert f"TORCH_CUDA_ARCH_LIST={shlex.quote(arch)} " in line
    assert "FORCE_CUDA=1" in line and "MAX_JOBS=" in line
    assert "--no-build-isolation" in line
    assert line.endswith("&& python -c 'import tiny_cuda_ext'")
