"""Many projects spawning at once on a GPU host: each gets a GPU of its own through
the spawner's own path (gpu_spawner.reserve, then a container from
objects.container_spec, then gpu_spawner.release as ProjectSpawner.stop does),
and each container sees only its own GPU, never one another project holds.

Run on a host with 2 or more GPUs and a Docker engine (see test_gpu_isolation.py):
    GPULAB_TEST_PREFIX=gpulabfault pytest -m gpu tests/test_gpu_concurrency.py -s
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import docker.errors
import pytest
from test_gpu_isolation import IMAGE, NETWORK, PREFIX, PYTHON, dk, inventory  # noqa: F401

from gpulab_hub.gpus import allocator
from gpulab_hub.gpus import spawner as gpu_spawner
from gpulab_hub.images import hostimage
from gpulab_hub.projects import objects

pytestmark = pytest.mark.gpu
INSTANCE = f"{PREFIX}-conc"  # the gpulab.instance label of this test's containers
PROJECTS = 8  # spawning at once
ROUNDS = 2  # spawns each project completes
HOLD = 3.0  # seconds each container keeps its GPU busy
PROBE = f"""
import json, subprocess, time, torch
out = {{"count": torch.cuda.device_count()}}
if out["count"]:
    a = torch.randn(2048, 2048, device="cuda")
    out["matmul"] = float((a @ a).abs().mean())
smi = subprocess.run(["/usr/local/nvidia/bin/nvidia-smi", "-L"], capture_output=True, text=True)
out["smi"] = [line for line in smi.stdout.splitlines() if line.startswith("GPU ")]
print("RESULT " + json.dumps(out), flush=True)
time.sleep({HOLD})
"""


@dataclass
class Cycle:
    owner: str
    uuid: str  # what the allocator gave
    granted: float  # monotonic: reserve returned
    freed: float  # monotonic: just before release
    seen: dict  # what the container saw


def start_project(docker_, tmp_path: Path, owner: str, n: int, assignment) -> dict:
    """Create, start and wait for one project container as the spawner builds it."""
    project = tmp_path / owner / f"r{n}"
    project.mkdir(parents=True)
    for sub in ("datasets", f"models/{owner}", f"outputs/{owner}"):
        (tmp_path / "data" / sub).mkdir(parents=True, exist_ok=True)
    settings = objects.ContainerInputs(
        name=f"{INSTANCE}-{owner}--p",
        image=IMAGE,
        command=[PYTHON, "-c", PROBE],
        env={"HOME": "/tmp"},
        project_dir=str(project),
        data_root=str(tmp_path / "data"),
        hf_cache_volume=f"{PREFIX}-hf-{owner}",
        network=NETWORK,
        port=8888,
        owner=owner,
        pids_limit=4096,
        labels={"gpulab.instance": INSTANCE, "gpulab.owner": owner, "gpulab.project": "p"},
        gpus=assignment,
    )
    spec = objects.container_spec(settings)
    spec["host_config"]["binds"].update(hostimage.binds(str(Path(PYTHON).parents[2])))
    spec["host_config"] = docker_.client.create_host_config(**spec["host_config"])
    c = docker_.call("create_container", **spec)
    try:
        docker_.call("start", c["Id"])
        status = docker_.call("wait", c["Id"], timeout=300)
        logs = docker_.call("logs", c["Id"]).decode(errors="replace")
    finally:
        docker_.call("remove_container", c["Id"], force=True)
    assert status["StatusCode"] == 0, logs
    return json.loads(next(ln for ln in logs.splitlines() if ln.startswith("RESULT "))[7:])


def test_concurrent_spawns_each_see_only_their_own_gpu(dk, inventory, tmp_path):  # noqa: F811
    whole = [d for d in inventory.devices if not d.parent_uuid]
    if len(whole) < 2:
        pytest.skip(f"needs two GPUs, this host has {len(whole)}")
    s = gpu_spawner.GpuTraits(allocations_file=str(tmp_path / "gpu-allocations.json"))
    gpu_spawner.forget_pending()
    cycles: list[Cycle] = []
    counts = {"tried": 0, "granted": 0, "refused": 0}
    lock, errors = threading.Lock(), []
    start = threading.Barrier(PROJECTS)
    deadline = time.monotonic() + 420

    def project(n: int) -> None:
        owner, rng, done = f"u{n}", random.Random(n), 0
        start.wait()
        while done < ROUNDS and time.monotonic() < deadline:
            with lock:
                counts["tried"] += 1
            try:
                assignment, _ = gpu_spawner.reserve(
                    s, dk.call, INSTANCE, allocator.Request(owner, "p", 1)
                )
            except allocator.AllocationError:
                with lock:
                    counts["refused"] += 1
                time.sleep(rng.uniform(0.2, 1.0))
                continue
            granted = time.monotonic()
            with lock:
                counts["granted"] += 1
            try:
                time.sleep(rng.uniform(0, 1.5))  # reserved, no container yet (a build runs)
                seen = start_project(dk, tmp_path, owner, done, assignment)
            finally:
                freed = time.monotonic()
                gpu_spawner.release(s, owner, "p")  # ProjectSpawner.stop
            with lock:
                cycles.append(Cycle(owner, assignment.uuids[0], granted, freed, seen))
            done += 1

    def run(n: int) -> None:
        try:
            project(n)
        except Exception as e:  # noqa: BLE001 - re-raised in the test's thread below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(PROJECTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gpu_spawner.forget_pending()
    for n in range(PROJECTS):
        with contextlib.suppress(docker.errors.NotFound):
            dk.call("remove_volume", f"{PREFIX}-hf-u{n}", force=True)
    if errors:
        raise errors[0]
    double = [
        (a.owner, b.owner, a.uuid)
        for i, a in enumerate(cycles)
        for b in cycles[i + 1 :]
        if a.uuid == b.uuid and a.granted < b.freed and b.granted < a.freed
    ]
    most = max(
        sum(1 for c in cycles if c.granted <= t < c.freed) for t in [c.granted for c in cycles]
    )
    print(
        f"\nconcurrent GPU spawns: {PROJECTS} projects, {counts['tried']} reserves tried, "
        f"{counts['granted']} granted, {counts['refused']} refused (GPUs busy), "
        f"{len(cycles)} containers ran, at most {most} at once on {len(whole)} GPUs; "
        f"double bookings seen: {len(double)}"
    )
    assert double == [], f"one GPU held by two projects at once: {double}"
    assert len(cycles) == PROJECTS * ROUNDS, "not every project got its turn"
    assert most <= len(whole)
    for c in cycles:
        assert c.seen["count"] == 1 and c.seen["matmul"] > 0, c
        assert len(c.seen["smi"]) == 1 and c.uuid in c.seen["smi"][0], c
    assert gpu_spawner.store_of(s).holdings() == {}  # every GPU given back
