"""gpulab doctor for real on this machine: its (absent) GPU, memory and disk, a real
Docker engine, probe containers, `gpulab doctor` itself and a real project's container."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import GPULAB, PREFIX
from hubclient import HubUser
from traitlets.config import Config

from gpulab_hub import hubsettings
from gpulab_hub.doctor import answer, docker_checks, gpu, probe, resources, sandbox
from gpulab_hub.doctor.findings import FAIL, OK, WARN

GPU_IDS = ("host.driver", "docker.gpu_access", "docker.gpu_container")


def run_doctor(env: dict, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run(
        [GPULAB, "doctor", *args], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip(), f"gpulab doctor printed nothing; stderr:\n{done.stderr}"
    return done, time.monotonic() - started


def by_id(items: list[dict]) -> dict[str, dict]:
    return {i["id"]: i for i in items}


# --- no Docker needed ---



def torch_version(env: dict) -> str:
    """The torch the test hubs' base image carries: the CPU wheel's version, or ""."""
    m = re.search(r"torch-([0-9.]+\+cpu)-", Path(env.get("GPULAB_TORCH", "")).name)
    return m.group(1) if m else ""

def test_no_driver_gives_a_clear_finding():
    inv = gpu.inventory()
    if inv.present:
        pytest.skip("this machine has an NVIDIA driver (test_doctor_gpu.py covers it)")
    wsl = resources.is_wsl2(Path("/proc/version").read_text(), os.environ)
    f = gpu.check_driver(inv, gpu.nvidia_pci_devices(), wsl, cpu_only=False)
    assert f.id == "host.driver" and f.status in (WARN, FAIL)
    assert "no NVIDIA driver" in f.seen and f.fix


def test_memory_and_disk_of_this_machine(tmp_path):
    f = resources.check_memory(Path("/proc/meminfo").read_text(), os.cpu_count() or 1)
    assert f.id == "host.memory" and "MAX_JOBS=" in f.seen
    assert resources.check_disk("disk.t", "tmp", str(tmp_path), (0, 0)).status == OK
    full = resources.check_disk("disk.t", "tmp", str(tmp_path / "not/yet"), (10**6, 10**6))
    assert full.status == FAIL and "docker system prune" in full.fix


def test_the_probe_runs_with_any_python3():
    source = Path(probe.__file__).read_text()
    for mode in ("image", "project"):
        out = subprocess.run(
            [sys.executable, "-c", source, mode], capture_output=True, text=True, check=True
        ).stdout
        facts = answer.read(out.encode(), False, mode)  # as the doctor reads every answer
        assert facts["python"] == sys.version.split()[0]
        assert "version" in facts["torch"]
    assert {"env", "device_nodes", "ldconfig", "libs"} <= set(facts)


def test_unreachable_engine_fails_fast(tmp_path):
    env = dict(os.environ, GPULAB_HOME=str(tmp_path), DOCKER_HOST=f"unix://{tmp_path}/none.sock")
    done, secs = run_doctor(env, "--json")
    items = by_id(json.loads(done.stdout))
    assert items["docker.engine"]["status"] == FAIL
    assert "gpulab up" in items["docker.engine"]["fix"]
    assert done.returncode == 1 and secs < 60
    assert (tmp_path / "hub" / "doctor-last.json").exists()


# --- a real engine, the base image `gpulab up` built, projects ---


@pytest.mark.docker
def test_probe_container_of_the_base_image(hub, docker_engine):
    dk = docker_checks.doctor_docker()
    engine, info = docker_checks.check_engine(dk)
    assert engine.status == OK and info["ServerVersion"] in engine.seen
    config = Config()
    config.ProjectSpawner.prefix = PREFIX  # the session hub's (GPULAB_CONTAINER_PREFIX)
    probes = sandbox.of_spawner(hubsettings.spawner_of(config))
    facts = sandbox.run_probe(dk, f"{PREFIX}/base:latest", ["image"], probes)
    assert facts["python"].startswith("3.")
    # the test hubs' base carries the CPU torch wheel when this machine has one (conftest)
    assert facts["torch"]["version"] == torch_version(hub.env), facts["torch"]
    with pytest.raises(answer.ProbeError, match="cannot create a container"):
        sandbox.run_probe(dk, f"{PREFIX}/no-such:image", ["image"], probes)
    assert not docker_engine.call("containers", all=True, filters={"name": f"{PREFIX}-doctor-"})


@pytest.mark.docker
def test_doctor_json_on_this_machine(hub):
    done, secs = run_doctor(hub.env, "--json")
    assert secs < 60, f"gpulab doctor --json took {secs:.1f} s"
    items = json.loads(done.stdout)
    for item in items:
        assert set(item) == {"id", "status", "seen", "fix"}
        assert item["status"] in (OK, WARN, FAIL)
        assert item["status"] == OK or item["fix"], item
    found = by_id(items)
    (driver,) = [i for i in items if "driver" in i["id"]]
    if not gpu.inventory().present:
        assert driver["status"] == WARN and "no NVIDIA driver" in driver["seen"]
        assert found["docker.gpu_container"]["status"] == WARN
        assert "skipped: no GPU" in found["docker.gpu_container"]["seen"]
    assert found["docker.engine"]["status"] == OK
    assert found[f"image.{PREFIX}/base:latest.cuda"]["status"] == OK
    assert f"{PREFIX}/base:latest" in found["images.in_use"]["seen"]
    for fid in ("host.memory", "disk.docker", "disk.gpulab_home", "host.hf_cache"):
        assert fid in found
    assert done.returncode == (1 if any(i["status"] == FAIL for i in items) else 0)
    saved = json.loads((hub.home / "hub" / "doctor-last.json").read_text())
    assert saved["findings"] == items and saved["exit_code"] == done.returncode


@pytest.mark.docker
def test_cpu_only_host_has_no_gpu_warnings(hub):
    if gpu.inventory().present:
        pytest.skip("this machine has a GPU")
    done, _ = run_doctor(hub.env, "--json", "--cpu-only")
    found = by_id(json.loads(done.stdout))
    for fid in GPU_IDS:
        assert found[fid]["status"] == OK and "CPU-only" in found[fid]["seen"]
    others = [i for i in found.values() if i["status"] != OK]
    assert done.returncode == (1 if any(i["status"] == FAIL for i in others) else 0)
    strict, _ = run_doctor(hub.env, "--json", "--cpu-only", "--strict")
    assert strict.returncode == (1 if others else 0)


@pytest.mark.docker
def test_table_for_people(hub):
    done, _ = run_doctor(hub.env)
    assert "host.driver" in done.stdout and "docker.engine" in done.stdout
    assert "\033[" not in done.stdout  # not a terminal: no colours
    assert "warnings" in done.stdout.splitlines()[-2] and "doctor-last.json" in done.stdout


@pytest.fixture(scope="module")
def admin(hub):
    a = HubUser(hub.url, "admin", hub.admin_password)
    assert a.login().status_code == 302
    a.new_token()
    return a


TWO_CUDART = f"""FROM {PREFIX}/base:latest
USER root
RUN mkdir -p /opt/cuda-11.8/lib64 /opt/cuda-12.1/lib64 \\
 && touch /opt/cuda-11.8/lib64/libcudart.so.11.8.89 /opt/cuda-12.1/lib64/libcudart.so.12.1.105
USER jovyan
ENV LD_LIBRARY_PATH=/opt/cuda-11.8/lib64:/opt/cuda-12.1/lib64 CUDA_VISIBLE_DEVICES=0
"""


@pytest.mark.docker
def test_project_checks_in_its_running_container_and_in_its_image(hub, admin, docker_engine):
    folder = hub.home / "projects" / "admin" / "doctorp"
    folder.mkdir(parents=True)
    (folder / "Dockerfile").write_text(TWO_CUDART)
    admin.start_project("doctorp")
    try:
        done, secs = run_doctor(hub.env, "--json", "--project", "admin/doctorp")
        found = by_id(json.loads(done.stdout))
        assert "the running container" in found["project.container"]["seen"], found
        cudart = found["project.cudart"]
        assert cudart["status"] == WARN and "2 versions" in cudart["seen"]
        assert "11.8.89" in cudart["seen"] and "12.1.105" in cudart["seen"]
        assert found["project.torch"]["status"] == OK
        version = torch_version(hub.env)
        assert (version or "not installed") in found["project.torch"]["seen"]
        assert found["project.visible_devices"]["seen"].startswith("no GPU is allocated")
        assert done.returncode == (1 if FAIL in {i["status"] for i in found.values()} else 0)
        assert secs < 60
        assert json.loads((hub.home / "hub" / "doctor-last.json").read_text())["project"] == (
            "admin/doctorp"
        )
    finally:
        admin.stop_project("doctorp")
    done, _ = run_doctor(hub.env, "--json", "--project", "admin/doctorp")
    found = by_id(json.loads(done.stdout))
    assert "a throwaway container of its image" in found["project.container"]["seen"]
    assert found["project.cudart"]["status"] == WARN
    assert not docker_engine.call("containers", all=True, filters={"name": f"{PREFIX}-doctor-"})


@pytest.mark.docker
def test_unknown_project(hub):
    done, _ = run_doctor(hub.env, "--json", "--project", "admin/never-made")
    found = by_id(json.loads(done.stdout))
    assert found["project.container"]["status"] == FAIL
    assert "no image" in found["project.container"]["seen"] and done.returncode == 1
    done, _ = run_doctor(hub.env, "--json", "--project", "just-a-name")
    assert by_id(json.loads(done.stdout))["project.container"]["status"] == FAIL
