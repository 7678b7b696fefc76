"""WSL2, where GPUs cannot be pinned (gpulab_hub/gpus/wsl.py): detected from a file system
tree; a GPU project's whole container spec; every GPU project shares every GPU (nothing
booked, nothing waits, nothing refused for being shared); the doctor and the GPU panel
say what works and what does not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_doctor_checks import PROBES, smi
from test_objects import EXPECTED_BINDS, EXPECTED_ENV, HARDENED, settings
from test_usage_page import settings as hub_settings

from gpulab_hub import gpus
from gpulab_hub.doctor import docker_checks, gpu, sandbox
from gpulab_hub.doctor.findings import FAIL, OK, WARN
from gpulab_hub.gpus import allocator, wsl
from gpulab_hub.gpus import spawner as gpu_spawner
from gpulab_hub.home import facts
from gpulab_hub.projects.objects import GpuAssignment, container_spec
from gpulab_jupyter import devices

RTX = "GPU-5c1d2e3f-0000-1111-2222-333344447777"
RTX_B = "GPU-5c1d2e3f-0000-1111-2222-333344448888"
KERNEL = "Linux version 5.15.167.4-microsoft-standard-WSL2 (root@f9c826d3017f) (gcc) #1 SMP\n"


def wsl_tree(root, lib: bool = True, kernel: str = KERNEL, nvidiactl: bool = False) -> str:
    """A WSL2 host's files as gpulab reads them, under ``root``."""
    (root / "dev").mkdir()
    (root / "dev" / "dxg").touch()
    if nvidiactl:
        (root / "dev" / "nvidiactl").touch()
    if lib:
        (root / "usr/lib/wsl/lib").mkdir(parents=True)
        (root / "usr/lib/wsl/lib/libcuda.so.1").touch()
    (root / "proc").mkdir()
    (root / "proc" / "version").write_text(kernel)
    return str(root)


# --- detection ---


def test_a_wsl2_host_is_shared_mode_with_what_was_found(tmp_path):
    host = wsl.detect(wsl_tree(tmp_path))
    assert host == wsl.GpuHost("wsl2-shared", "/dev/dxg", "/usr/lib/wsl/lib", True)
    assert host.shared


def test_a_linux_host_and_a_host_without_gpu_are_pinned(tmp_path):
    assert wsl.detect(str(tmp_path)) == wsl.GpuHost("pinned")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidiactl").touch()
    assert not wsl.detect(str(tmp_path)).shared
    # NVIDIA's own nodes win over /dev/dxg: gpulab can pin those GPUs.
    other = tmp_path / "both"
    other.mkdir()
    assert not wsl.detect(wsl_tree(other, nvidiactl=True)).shared


def test_wsl2_without_the_windows_driver_says_its_libraries_are_missing(tmp_path):
    host = wsl.detect(wsl_tree(tmp_path, lib=False))
    assert host.shared and host.lib_dir == ""


def test_proc_version_is_read_bounded(tmp_path):
    root = wsl_tree(tmp_path, kernel="x" * (wsl.PROC_VERSION_MAX + 10) + " microsoft")
    host = wsl.detect(root)
    assert host.shared and not host.kernel_says_wsl  # the word past the bound is never read


# --- the container spec (whole objects) ---

WSL2_GPUS = GpuAssignment(uuids=(RTX,), isolation="wsl2", driver_dir="/usr/lib/wsl")


def test_gpu_spec_on_wsl2():
    spec = container_spec(settings(gpus=WSL2_GPUS))
    assert spec["host_config"] == {
        "binds": {**EXPECTED_BINDS, "/usr/lib/wsl": {"bind": "/usr/lib/wsl", "mode": "ro"}},
        **HARDENED,
        "shm_size": "8g",
        "devices": ["/dev/dxg:/dev/dxg:rwm"],
    }
    assert spec["environment"] == {
        **{k: v for k, v in EXPECTED_ENV.items() if k != "CUDA_VISIBLE_DEVICES"},
        "NVIDIA_VISIBLE_DEVICES": "all",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "LD_LIBRARY_PATH": "/usr/lib/wsl/lib",
        "GPULAB_GPU_SHARING": "wsl2-shared",
    }
    assert "/usr/lib/wsl" in spec["volumes"]


def test_a_cpu_project_on_wsl2_gets_no_gpu():
    spec = container_spec(settings())
    assert "devices" not in spec["host_config"]
    assert "/usr/lib/wsl" not in spec["host_config"]["binds"]
    assert spec["environment"]["NVIDIA_VISIBLE_DEVICES"] == "void"


# --- every GPU project shares every GPU ---


def _device(index: int, uuid: str) -> gpus.Device:
    return gpus.Device(str(index), uuid, "NVIDIA GeForce RTX 4090", 24 << 30, "8.9", minor=index)


class FakeSpawner(gpu_spawner.GpuTraits):
    def __init__(self, tmp_path, **kw):
        super().__init__(allocations_file=str(tmp_path / "hub" / "gpu-allocations.json"), **kw)
        self.events: list[tuple[int, str, bool]] = []

    def _emit(self, progress: int, message: str, note: bool = False):
        self.events.append((progress, message, note))


def no_docker(*args, **kwargs):
    raise AssertionError("a WSL2 GPU start asks Docker nothing")


@pytest.fixture
def wsl2_host(tmp_path, monkeypatch):
    root = tmp_path / "host"
    root.mkdir()
    monkeypatch.setattr(wsl, "HOST_ROOT", wsl_tree(root))
    inv = gpus.Inventory([_device(0, RTX), _device(1, RTX_B)], "581.57", "13.0")
    monkeypatch.setattr(gpu_spawner, "cached_inventory", lambda: inv)
    return root


def test_every_gpu_project_shares_every_gpu_and_none_waits(wsl2_host, tmp_path):
    s = FakeSpawner(tmp_path, gpu_max_per_user=1)
    given = []
    for project in ("one", "two", "three"):
        request = allocator.Request("alice", project, count=1)
        g, devs = gpu_spawner.reserve(s, no_docker, "gl", request)
        given.append(g)
        assert devs == []  # no "Reserved GPU 0" line: nothing is reserved
    assert all(g.isolation == "wsl2" and g.uuids == (RTX, RTX_B) for g in given)
    assert not os.path.exists(s.allocations_file)  # nothing booked, so nothing to reclaim
    assert s.events == [(75, wsl.SHARED_NOTE, True)] * 3
    assert wsl.SHARED_NOTE == (
        "Shared GPU (WSL2): all projects on this computer share it; gpulab cannot pin or measure it"
    )
    # Stopping frees nothing and fails nothing.
    assert gpu_spawner.release(s, "alice", "one") == []


def test_what_wsl2_can_never_give_is_refused_at_once_not_queued(wsl2_host, tmp_path):
    s = FakeSpawner(tmp_path)
    for request, words in [
        (allocator.Request("bob", "p", count=3), "this computer has 2"),
        (allocator.Request("bob", "p", mig_profile="1g.10gb"), "not available on WSL2"),
    ]:
        with pytest.raises(allocator.AllocationError) as e:
            gpu_spawner.reserve(s, no_docker, "gl", request)
        assert words in str(e.value) and e.value.busy == ()  # busy: the queue would wait


def test_wsl2_without_the_windows_driver_refuses_a_gpu_start(tmp_path, monkeypatch):
    root = tmp_path / "host"
    root.mkdir()
    monkeypatch.setattr(wsl, "HOST_ROOT", wsl_tree(root, lib=False))
    monkeypatch.setattr(gpu_spawner, "cached_inventory", lambda: gpus.Inventory())
    with pytest.raises(allocator.AllocationError, match="driver for Windows"):
        gpu_spawner.reserve(FakeSpawner(tmp_path), no_docker, "gl", allocator.Request("c", "p", 1))


def test_the_home_page_says_the_gpu_is_shared_not_hours_it_cannot_count(tmp_path, monkeypatch):
    w = hub_settings(tmp_path, {"*": 40.0})
    monkeypatch.setattr(facts, "_device_names", lambda: {RTX: "GPU 0 (RTX 4090)"})
    assert facts.gpu_use(w, "alice", []) == "GPU this week: 0.0 h of 40 h"  # pinned host
    root = tmp_path / "host"
    root.mkdir()
    monkeypatch.setattr(wsl, "HOST_ROOT", wsl_tree(root))
    assert facts.gpu_use(w, "alice", []) == wsl.SHARED_NOTE


# --- the doctor ---


def test_the_doctor_names_wsl2_shared_mode_with_what_works_and_what_does_not(tmp_path):
    f = gpu.check_gpu_sharing(wsl.detect(wsl_tree(tmp_path)))
    assert f.id == "host.gpu_sharing" and f.status == WARN
    assert "WSL2 shared GPU (/dev/dxg" in f.seen and "/usr/lib/wsl/lib" in f.seen
    works, does_not = f.seen.split("Works: ")[1].split("Does not work: ")
    assert "CUDA in projects" in works
    for missing in ("own for each project", "utilisation", "per-process GPU memory",
                    "reclaim of idle GPUs", "slices"):  # fmt: skip
        assert missing in does_not
    assert "Linux without WSL" in f.fix
    assert gpu.check_gpu_sharing(wsl.detect(str(tmp_path / "nothing"))) is None
    doc = (Path(__file__).parents[1] / "docs" / "doctor.md").read_text()
    assert "`host.gpu_sharing`" in doc


def test_the_doctors_gpu_container_is_given_the_gpu_as_a_project_is(tmp_path):
    root = wsl_tree(tmp_path)
    dev = os.path.join(root, "dev")
    inv = smi("h100-550")
    info = {"Runtimes": {"nvidia": {}}}  # Docker Desktop's runtime cannot pick a GPU here
    f = docker_checks.check_gpu_access(info, inv, "/usr/local/nvidia", False, dev)
    assert f.status == OK and "/dev/dxg" in f.seen and "shared" in f.seen
    g = docker_checks.all_gpus(inv, info, "/usr/local/nvidia", dev)
    spec = sandbox.probe_spec(PROBES, "img", ["python3"], g)
    assert spec["host_config"]["devices"] == ["/dev/dxg:/dev/dxg:rwm"]
    assert "device_requests" not in spec["host_config"]
    assert spec["host_config"]["binds"] == {"/usr/lib/wsl": {"bind": "/usr/lib/wsl", "mode": "ro"}}
    assert spec["environment"]["LD_LIBRARY_PATH"] == "/usr/lib/wsl/lib"


def test_the_doctor_fails_gpu_access_on_wsl2_without_the_windows_driver(tmp_path):
    dev = os.path.join(wsl_tree(tmp_path, lib=False), "dev")
    f = docker_checks.check_gpu_access({}, smi("h100-550"), "/usr/local/nvidia", False, dev)
    assert f.status == FAIL and "NVIDIA driver for Windows" in f.fix


# --- the GPU panel's status ---


def test_the_project_server_sees_wsl2_in_its_container(tmp_path):
    assert devices.sharing_of(wsl_tree(tmp_path)) == {
        "mode": "wsl2-shared",
        "words": "shared GPU (WSL2) — utilisation not available",
    }
    assert devices.sharing_of(str(tmp_path / "elsewhere")) is None
