"""What gpulab's base image is built FROM where the admin chose nothing: NVIDIA's CUDA
image and PyPI's CUDA torch on a GPU host (so torch.cuda.is_available() holds in a new
project with no settings), the local Debian without GPUs; and a host that cannot pull
the CUDA image is told what to set."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpulab_hub import host, settings
from gpulab_hub.cli import base_spec_for
from gpulab_hub.gpus import Device, Inventory
from gpulab_hub.images import base as baseimage

REPO = Path(__file__).resolve().parents[1]
H100 = Device("0", "GPU-1", "NVIDIA H100 80GB HBM3", 80 << 30, "9.0")


def test_a_gpu_host_builds_from_cuda_with_cuda_torch_by_default():
    spec = base_spec_for(settings.parse({}), Inventory(devices=[H100], driver="580"))
    assert spec.base_image == baseimage.CUDA_FROM
    assert spec.base_image.startswith("nvidia/cuda:") and "devel" in spec.base_image
    assert spec.torch == "torch"  # PyPI's Linux torch: the CUDA build
    assert spec.variant == "gpu"


def test_a_host_without_gpus_builds_from_the_local_debian_without_torch():
    spec = base_spec_for(settings.parse({}), Inventory(problem="no NVIDIA driver"))
    assert spec.base_image == baseimage.LOCAL_FROM == "gpulab/debian:bookworm"
    assert spec.torch == ""
    assert spec.variant == "cpu"


def test_the_admins_choice_wins_on_a_gpu_host():
    s = settings.parse(
        {"GPULAB_BASE_FROM": "gpulab/debian:bookworm", "GPULAB_TORCH": "torch==2.9.1"}
    )
    spec = base_spec_for(s, Inventory(devices=[H100]))
    assert (spec.base_image, spec.torch) == ("gpulab/debian:bookworm", "torch==2.9.1")


def test_compose_builds_from_the_same_cuda_image():
    text = (REPO / "compose.yml").read_text()
    m = re.search(r"GPULAB_BASE_FROM: \$\{GPULAB_BASE_FROM:-([^}]+)\}", text)
    assert m and m.group(1) == baseimage.CUDA_FROM


def test_an_image_the_engine_cannot_pull_is_refused_in_words(docker_engine):
    # a registry on this machine's loopback that does not exist: refused at once
    ref = "127.0.0.1:9/gpulabtest/cuda:none"
    with pytest.raises(host.HostError) as e:
        host.ensure_pulled(docker_engine, ref, log=lambda line: None)
    message = str(e.value)
    assert f"Could not pull {ref}" in message
    assert "set GPULAB_BASE_FROM" in message and "gpulab/debian:bookworm" in message
