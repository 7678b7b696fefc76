"""gpulab's nvidia-smi stand-in (images/nvidia-smi.sh, /usr/local/bin/nvidia-smi in the
base images), run for real in containers: without a GPU it says why in plain words and
fails as nvidia-smi does; where the driver's nvidia-smi is there, that one answers, with
the user's arguments, and the stand-in never runs itself. On a GPU host (``gpu``
marker): in a project container given one GPU, ``nvidia-smi -L`` lists exactly one."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from gpulab_hub import host
from gpulab_hub.projects import objects

REPO = Path(__file__).resolve().parents[1]
STAND_IN = REPO / "images" / "nvidia-smi.sh"
PREFIX = os.environ.get("GPULAB_TEST_PREFIX", "gpulabtest")
FAKE_DRIVER = '#!/bin/sh\necho "driver nvidia-smi: $*"\n'


def run(dk, image: str, line: str, binds: dict, env: dict) -> tuple[int, str]:
    """``sh -c line`` in a fresh container (no network, no capabilities); exit, output."""
    c = dk.call(
        "create_container",
        image,
        ["/bin/sh", "-c", line],
        name=f"{PREFIX}-smi-{uuid.uuid4().hex[:8]}",
        environment={"PATH": "/usr/local/bin:/usr/bin:/bin", **env},
        host_config=dk.client.create_host_config(
            binds=binds, network_mode="none", cap_drop=["ALL"], security_opt=["no-new-privileges"]
        ),
    )
    try:
        dk.call("start", c["Id"])
        status = dk.call("wait", c["Id"], timeout=60)
        return status["StatusCode"], dk.call("logs", c["Id"]).decode(errors="replace")
    finally:
        dk.call("remove_container", c["Id"], force=True)


@pytest.fixture
def stand_in(tmp_path) -> dict:
    """The stand-in where the base image puts it, and a place for a driver folder."""
    tmp_path.chmod(0o755)
    script = tmp_path / "nvidia-smi"
    shutil.copyfile(STAND_IN, script)
    script.chmod(0o755)
    return {str(script): {"bind": "/usr/local/bin/nvidia-smi", "mode": "ro"}}


def driver(tmp_path, name: str) -> str:
    folder = tmp_path / name
    (folder / "bin").mkdir(parents=True)
    (folder / "lib64").mkdir()
    smi = folder / "bin" / "nvidia-smi"
    smi.write_text(FAKE_DRIVER)
    smi.chmod(0o755)
    return str(folder)


@pytest.mark.docker
def test_no_gpu_on_this_host_is_told_in_plain_words(docker_engine, local_debian, stand_in):
    code, out = run(docker_engine, local_debian, "nvidia-smi", stand_in, {"GPULAB_HOST_GPUS": ""})
    assert code == 9, out
    assert out.startswith("nvidia-smi: this project has no GPU because the machine gpulab runs")
    assert "Code here runs on the CPU." in out


@pytest.mark.docker
def test_a_project_started_without_a_gpu_is_told_how_to_get_one(
    docker_engine, local_debian, stand_in, tmp_path
):
    # a copy of the stand-in later on PATH is no driver: it is not run (no loop)
    copy = tmp_path / "copy"
    shutil.copyfile(STAND_IN, copy)
    copy.chmod(0o755)
    binds = {**stand_in, str(copy): {"bind": "/usr/bin/nvidia-smi", "mode": "ro"}}
    env = {"GPULAB_HOST_GPUS": "NVIDIA A10, NVIDIA A10", "NVIDIA_VISIBLE_DEVICES": "void"}
    code, out = run(docker_engine, local_debian, "nvidia-smi -L", binds, env)
    assert code == 9, out
    assert out.splitlines() == [
        "nvidia-smi: this project has no GPU: it was started without one.",
        "This host has: NVIDIA A10, NVIDIA A10",
        "To use a GPU, stop the project from the gpulab home page (Stop), then start it",
        "again (Start) and choose how many GPUs it gets.",
    ]


@pytest.mark.docker
def test_the_drivers_nvidia_smi_answers_where_the_project_has_a_gpu(
    docker_engine, local_debian, stand_in, tmp_path
):
    # gpulab's device path: the driver folder (default /usr/local/nvidia), read-only,
    # not on a login shell's PATH; the stand-in (first on PATH) hands over to it
    default = driver(tmp_path, "default")
    binds = {**stand_in, default: {"bind": "/usr/local/nvidia", "mode": "ro"}}
    env = {"GPULAB_HOST_GPUS": "NVIDIA A10", "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64"}
    code, out = run(docker_engine, local_debian, "nvidia-smi -L --id=0", binds, env)
    assert (code, out) == (0, "driver nvidia-smi: -L --id=0\n")
    # an admin's other driver_dir: found through LD_LIBRARY_PATH, as gpulab sets it
    other = driver(tmp_path, "other")
    binds = {**stand_in, other: {"bind": "/opt/nvidia-driver", "mode": "ro"}}
    env = {"GPULAB_HOST_GPUS": "NVIDIA A10", "LD_LIBRARY_PATH": "/opt/nvidia-driver/lib64"}
    code, out = run(docker_engine, local_debian, "nvidia-smi -q", binds, env)
    assert (code, out) == (0, "driver nvidia-smi: -q\n")
    # the NVIDIA runtime's: /usr/bin/nvidia-smi, after /usr/local/bin on PATH
    runtime = Path(driver(tmp_path, "runtime")) / "bin" / "nvidia-smi"
    binds = {**stand_in, str(runtime): {"bind": "/usr/bin/nvidia-smi", "mode": "ro"}}
    code, out = run(docker_engine, local_debian, "nvidia-smi", binds, {"GPULAB_HOST_GPUS": "A10"})
    assert (code, out) == (0, "driver nvidia-smi: \n")
    # WSL2: the Windows driver's nvidia-smi in /usr/lib/wsl/lib (gpus/wsl.py mounts it)
    wsl = Path(driver(tmp_path, "wsl")) / "bin" / "nvidia-smi"
    binds = {**stand_in, str(wsl): {"bind": "/usr/lib/wsl/lib/nvidia-smi", "mode": "ro"}}
    env = {"GPULAB_HOST_GPUS": "A10", "LD_LIBRARY_PATH": "/usr/lib/wsl/lib"}
    code, out = run(docker_engine, local_debian, "nvidia-smi -L", binds, env)
    assert (code, out) == (0, "driver nvidia-smi: -L\n")


@pytest.mark.gpu
def test_nvidia_smi_in_a_one_gpu_project_lists_exactly_that_gpu(tmp_path):
    """As a user types it, through the stand-in, in a container from the project spec
    (gpulab's way of giving GPUs on this host) holding one of the host's GPUs."""
    from gpulab_hub import gpus
    from gpulab_hub.images import hostimage

    inv = gpus.inventory()
    assert inv.devices, f"no GPU: {inv.problem}"
    dk = host.Docker()
    image = f"{PREFIX}/host-userland:latest"
    hostimage.ensure_image(dk.call, image)
    network = f"{PREFIX}-smi-net"
    host.ensure_network(dk, network)
    isolation = objects.detect_isolation(dk.call("info"))
    one = inv.devices[-1]
    tmp_path.chmod(0o755)
    (tmp_path / "first").mkdir()
    for sub in ("datasets", "projects/alice/first/models", "projects/alice/first/outputs"):
        (tmp_path / "data" / sub).mkdir(parents=True, exist_ok=True)
    script = tmp_path / "nvidia-smi"
    shutil.copyfile(STAND_IN, script)
    script.chmod(0o755)
    settings = objects.ContainerInputs(
        name=f"{PREFIX}-alice--first-smi",
        image=image,
        command=["/bin/sh", "-c", "nvidia-smi -L"],
        env={"HOME": "/tmp", "GPULAB_HOST_GPUS": one.name},
        project_dir=str(tmp_path / "first"),
        data_root=str(tmp_path / "data"),
        hf_cache_volume=f"{PREFIX}-hf-alice",
        network=network,
        port=8888,
        owner="alice",
        gpus=objects.GpuAssignment(uuids=(one.uuid,), minors=(one.minor,), isolation=isolation),
    )
    spec = objects.container_spec(settings)
    # this image's /usr is the host's, read-only: the stand-in goes first on PATH beside it
    binds = spec["host_config"]["binds"]
    binds.update(hostimage.binds("/opt/torch"))
    binds[str(script)] = {"bind": "/opt/gpulab-bin/nvidia-smi", "mode": "ro"}
    spec["environment"]["PATH"] = "/opt/gpulab-bin:/usr/local/bin:/usr/bin:/bin"
    spec["host_config"] = dk.client.create_host_config(**spec["host_config"])
    c = dk.call("create_container", **spec)
    try:
        dk.call("start", c["Id"])
        code = dk.call("wait", c["Id"], timeout=120)["StatusCode"]
        out = dk.call("logs", c["Id"]).decode(errors="replace")
    finally:
        dk.call("remove_container", c["Id"], force=True)
        dk.call("remove_network", network)
    print(f"isolation {isolation}, host GPUs {len(inv.devices)}:\n{out}")
    listed = [line for line in out.splitlines() if line.startswith("GPU ")]
    assert code == 0, out
    assert len(listed) == 1 and one.uuid in listed[0], out
