"""GPU allocation and isolation in real containers on a real GPU host.

Run on a GPU host with a Docker engine (see ../shared/gpu-host/README.md):
    pytest -m gpu tests/test_gpu_isolation.py -s
Each container is built from the spec ProjectSpawner would pass to Docker
(objects.container_spec: gpulab's bridge network, the notebook user, no
capabilities, no privilege gain), on an image whose userland is the host's own.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from gpulab_hub import gpus, host
from gpulab_hub.gpus import allocator
from gpulab_hub.images import hostimage
from gpulab_hub.projects import objects

pytestmark = pytest.mark.gpu
PREFIX = os.environ.get("GPULAB_TEST_PREFIX", "gpulabgpu")
IMAGE = f"{PREFIX}/host-userland:latest"
NETWORK = f"{PREFIX}-net"
PYTHON = os.environ.get("GPULAB_GPU_PYTHON", "/opt/torch/.venv/bin/python3")
PROBE = """
import json, os, subprocess, torch
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status") if ":\\t" in line)
out = {"count": torch.cuda.device_count(), "uid": os.getuid(),
       "cap_eff": status["CapEff"].strip(), "no_new_privs": status["NoNewPrivs"].strip(),
       "uid_map": open("/proc/self/uid_map").read().split()}
if out["count"]:
    out["name"] = torch.cuda.get_device_name(0)
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    out["matmul"] = float((a @ a).float().abs().mean())
smi = subprocess.run(["/usr/local/nvidia/bin/nvidia-smi", "-L"], capture_output=True, text=True)
out["smi"] = [line for line in smi.stdout.splitlines() if line.startswith("GPU ")]
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def dk():
    d = host.Docker()
    if not d.reachable():
        pytest.skip("no Docker engine here: start one (../shared/gpu-host/start-docker.sh)")
    hostimage.ensure_image(d.call, IMAGE)
    print(f"network {NETWORK}: gateway {host.ensure_network(d, NETWORK)}")
    yield d
    for c in d.call("containers", all=True, filters={"name": PREFIX}):
        d.call("remove_container", c["Id"], force=True)
    d.call("remove_network", NETWORK)


@pytest.fixture(scope="module")
def inventory():
    inv = gpus.inventory()
    if not inv.devices:
        pytest.skip(f"no GPU: {inv.problem}")
    print(f"\ninventory: driver {inv.driver}, CUDA {inv.cuda}")
    for d in inv.devices:
        print(f"  GPU {d.index} {d.name} {d.uuid} cc {d.capability} minor {d.minor}")
    return inv


def run_project(dk, tmp_path, name: str, assignment: objects.GpuAssignment) -> dict:
    """Create and run one project container from the spawner's spec; its probe output."""
    project = tmp_path / name
    project.mkdir()
    for sub in ("datasets", "models/alice", "outputs/alice"):
        (tmp_path / "data" / sub).mkdir(parents=True, exist_ok=True)
    settings = objects.ContainerInputs(
        name=f"{PREFIX}-alice--{name}",
        image=IMAGE,
        command=[PYTHON, "-c", PROBE],
        env={"HOME": "/tmp"},
        project_dir=str(project),
        data_root=str(tmp_path / "data"),
        hf_cache_volume=f"{PREFIX}-hf-alice",
        network=NETWORK,
        port=8888,
        owner="alice",
        pids_limit=4096,
        labels={"gpulab.instance": PREFIX, "gpulab.owner": "alice", "gpulab.project": name},
        gpus=assignment,
    )
    spec = objects.container_spec(settings)
    spec["host_config"]["binds"].update(hostimage.binds(str(Path(PYTHON).parents[2])))
    spec["host_config"] = dk.client.create_host_config(**spec["host_config"])
    t0 = time.perf_counter()
    c = dk.call("create_container", **spec)
    dk.call("start", c["Id"])
    status = dk.call("wait", c["Id"], timeout=300)
    elapsed = time.perf_counter() - t0
    logs = dk.call("logs", c["Id"]).decode(errors="replace")
    dk.call("remove_container", c["Id"], force=True)
    assert status["StatusCode"] == 0, logs
    line = next(ln for ln in logs.splitlines() if ln.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    result["seconds"] = round(elapsed, 2)
    print(f"{name}: {result}")
    return result


def reserve(store, inv, project: str, count: int, isolation: str, policy=None):
    devices = store.allocate(
        inv.devices, allocator.Request("alice", project, count), policy or allocator.Policy()
    )
    return objects.GpuAssignment(
        uuids=tuple(d.uuid for d in devices),
        minors=tuple(d.minor for d in devices),
        isolation=isolation,
    )


def test_one_gpu_project_sees_exactly_its_gpu(dk, inventory, tmp_path):
    isolation = objects.detect_isolation(dk.call("info"))
    print(f"isolation path: {isolation}")
    assert isolation in (objects.RUNTIME, objects.DEVICES)
    store = allocator.AllocationStore(tmp_path / "alloc.json")
    mine = reserve(store, inventory, "one", 1, isolation)
    out = run_project(dk, tmp_path, "one", mine)
    assert out["count"] == 1
    assert out["matmul"] > 0
    # The GPU works in the hardened container: notebook user, no capabilities, no gain.
    assert out["uid"] == 1000 and int(out["cap_eff"], 16) == 0 and out["no_new_privs"] == "1"
    print(f"uid_map in the container: {out['uid_map']}")
    assert [mine.uuids[0] in line for line in out["smi"]] == [True]

    cpu = run_project(dk, tmp_path, "cpu", objects.GpuAssignment())
    assert cpu["count"] == 0 and cpu["smi"] == []
    print(f"spawn-to-result: GPU project {out['seconds']} s, CPU project {cpu['seconds']} s")


def test_busy_gpu_is_refused_naming_the_holder(inventory, tmp_path):
    store = allocator.AllocationStore(tmp_path / "alloc.json")
    whole = [d for d in inventory.devices if not d.parent_uuid]
    for i, _ in enumerate(whole):
        store.allocate(
            inventory.devices, allocator.Request("alice", f"p{i}", 1), allocator.Policy()
        )
    with pytest.raises(allocator.AllocationError) as err:
        store.allocate(inventory.devices, allocator.Request("bob", "late", 1), allocator.Policy())
    print(f"refusal: {err.value}")
    assert "alice/p0" in str(err.value)


def test_two_projects_get_different_gpus_and_see_only_their_own(dk, inventory, tmp_path):
    whole = [d for d in inventory.devices if not d.parent_uuid]
    if len(whole) < 2:
        pytest.skip(f"needs two GPUs, this host has {len(whole)}")
    isolation = objects.detect_isolation(dk.call("info"))
    store = allocator.AllocationStore(tmp_path / "alloc.json")
    a = reserve(store, inventory, "a", 1, isolation)
    b = reserve(store, inventory, "b", 1, isolation)
    assert a.uuids != b.uuids
    out_a = run_project(dk, tmp_path, "a", a)
    out_b = run_project(dk, tmp_path, "b", b)
    for out, mine, other in ((out_a, a, b), (out_b, b, a)):
        assert out["count"] == 1
        assert len(out["smi"]) == 1 and mine.uuids[0] in out["smi"][0]
        assert other.uuids[0] not in " ".join(out["smi"])
