"""Spawn-to-ready of a GPU project vs a CPU project, on a GPU host.

Each start is a container made from the spec ProjectSpawner passes to Docker
(objects.container_spec, with one GPU reserved through the allocator or none),
on an image whose userland is the host's own (hostimage). Ready means torch in
the container answered: for the GPU project, after a CUDA context and a small
matmul on the device; for the CPU project, after the same matmul on the CPU.

    python3 benchmarks/gpu_spawn.py [--n 5] [--python /opt/torch/.venv/bin/python3]

Last line: ``gpu_spawn_p50_ratio=<GPU project p50 / CPU project p50>``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gpulab_hub import gpus, host
from gpulab_hub.gpus import allocator
from gpulab_hub.images import hostimage
from gpulab_hub.projects import objects

PREFIX = "gpulabbench-gpu"
IMAGE = f"{PREFIX}/host-userland:latest"
NETWORK = f"{PREFIX}-net"
PROBE = (
    "import torch; d = 'cuda' if torch.cuda.is_available() else 'cpu'; "
    "a = torch.ones(256, 256, device=d); print('ready', d, float((a @ a).sum()))"
)


def start_once(dk: host.Docker, root: Path, name: str, g: objects.GpuAssignment, python: str):
    for sub in ("datasets", "models/bench", "outputs/bench"):
        (root / "data" / sub).mkdir(parents=True, exist_ok=True)
    (root / name).mkdir(exist_ok=True)
    spec = objects.container_spec(
        objects.ContainerInputs(
            name=f"{PREFIX}-bench--{name}",
            image=IMAGE,
            command=[python, "-c", PROBE],
            env={"HOME": "/tmp"},
            project_dir=str(root / name),
            data_root=str(root / "data"),
            hf_cache_volume=f"{PREFIX}-hf-bench",
            network=NETWORK,
            port=8888,
            owner="bench",
            labels={"gpulab.instance": PREFIX},
            gpus=g,
        )
    )
    spec["host_config"]["binds"].update(hostimage.binds(str(Path(python).parents[2])))
    spec["host_config"] = dk.client.create_host_config(**spec["host_config"])
    t0 = time.perf_counter()
    c = dk.call("create_container", **spec)
    dk.call("start", c["Id"])
    status = dk.call("wait", c["Id"], timeout=300)
    seconds = time.perf_counter() - t0
    logs = dk.call("logs", c["Id"]).decode(errors="replace")
    dk.call("remove_container", c["Id"], force=True)
    if status["StatusCode"] != 0 or "ready" not in logs:
        raise RuntimeError(f"{name} failed:\n{logs[-2000:]}")
    return seconds, logs.strip().splitlines()[-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5, help="starts per side (default 5)")
    ap.add_argument("--python", default="/opt/torch/.venv/bin/python3", help="host torch python")
    args = ap.parse_args()
    inv = gpus.inventory()
    if not inv.devices:
        print(f"no GPU here: {inv.problem}")
        return 1
    dk = host.Docker()
    if not dk.reachable():
        print("no Docker engine answers")
        return 1
    hostimage.ensure_image(dk.call, IMAGE)
    host.ensure_network(dk, NETWORK)
    isolation = objects.detect_isolation(dk.call("info"))
    with tempfile.TemporaryDirectory(prefix="gpulab-gpu-spawn-") as tmp:
        root = Path(tmp)
        store = allocator.AllocationStore(root / "alloc.json")
        times: dict[str, list[float]] = {"gpu": [], "cpu": []}
        for i in range(args.n + 1):  # the first round warms caches and is dropped
            for side in ("gpu", "cpu") if i % 2 else ("cpu", "gpu"):
                g = objects.GpuAssignment()
                if side == "gpu":
                    req = allocator.Request("bench", f"gpu{i}", 1)
                    d = store.allocate(inv.devices, req, allocator.Policy())[0]
                    g = objects.GpuAssignment((d.uuid,), (d.minor,), isolation)
                seconds, line = start_once(dk, root, f"{side}{i}", g, args.python)
                store.release("bench", f"gpu{i}")
                if i:
                    times[side].append(seconds)
                print(f"{side} start {i}: {seconds:.2f} s ({line})")
    dk.call("remove_image", IMAGE)
    gpu_p50, cpu_p50 = statistics.median(times["gpu"]), statistics.median(times["cpu"])
    print(f"GPU {inv.gpus[0].name}, driver {inv.driver}, isolation path: {isolation}")
    print(f"GPU project: p50 {gpu_p50:.2f} s, max {max(times['gpu']):.2f} s")
    print(f"CPU project: p50 {cpu_p50:.2f} s, max {max(times['cpu']):.2f} s")
    print(f"gpu_spawn_p50_ratio={gpu_p50 / cpu_p50:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
