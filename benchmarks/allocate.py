"""GPU allocation decision time: 1,000 projects over 8 simulated GPUs (pure logic).

A few users' projects ask, one after another, for 0-2 GPUs in shared mode with
a per-GPU cap high enough that most requests succeed and the last ones are
refused. Each ``choose`` call is timed (``time.perf_counter_ns``) over several
rounds of the whole sequence; the holdings grow as in a hub that fills up. The
store's ``allocate`` (JSON file, lock, fsync) is timed separately on the same
sequence. No GPU, no Docker.

    .venv/bin/python benchmarks/allocate.py [--projects 1000 --gpus 8 --rounds 5]

Last line: ``alloc_us_per_decision=<mean microseconds per choose call>``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from gpulab_hub.gpus import Device
from gpulab_hub.gpus.allocator import (
    AllocationError,
    AllocationStore,
    Holder,
    Policy,
    Request,
    choose,
)


def simulated_gpus(n: int) -> list[Device]:
    return [
        Device(
            index=str(i),
            uuid=f"GPU-{i:08x}-bench-0000-0000-000000000000",
            name="NVIDIA H100 80GB HBM3",
            memory_total=80 << 30,
            capability="9.0",
        )
        for i in range(n)
    ]


def workload(projects: int, users: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    return [
        Request(f"user{rng.randrange(users)}", f"p{n}", rng.choices([0, 1, 2], [1, 2, 1])[0])
        for n in range(projects)
    ]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_choose(devices, requests, policy, rounds: int) -> tuple[list[float], int, int]:
    samples: list[float] = []
    granted = refused = 0
    for _ in range(rounds):
        held: dict[str, tuple[Holder, ...]] = {}
        granted = refused = 0
        for r in requests:
            t0 = time.perf_counter_ns()
            try:
                got = choose(devices, held, r, policy)
            except AllocationError:
                got = None
            samples.append((time.perf_counter_ns() - t0) / 1000)
            if got is None:
                refused += 1
                continue
            granted += 1
            for d in got:
                held[d.uuid] = held.get(d.uuid, ()) + (Holder(r.owner, r.project, 0.0),)
    return samples, granted, refused


def run_store(devices, requests, policy) -> tuple[list[float], int]:
    samples: list[float] = []
    refused = 0
    with tempfile.TemporaryDirectory(prefix="gpulabbench-alloc-") as tmp:
        store = AllocationStore(Path(tmp) / "gpus.json")
        for r in requests:
            t0 = time.perf_counter_ns()
            try:
                store.allocate(devices, r, policy)
            except AllocationError:
                refused += 1
            samples.append((time.perf_counter_ns() - t0) / 1000)
    return samples, refused


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--projects", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--users", type=int, default=5)
    ap.add_argument("--cap", type=int, default=120, help="shared mode: projects per GPU")
    ap.add_argument("--rounds", type=int, default=5, help="times the whole sequence is decided")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    devices = simulated_gpus(args.gpus)
    requests = workload(args.projects, args.users, args.seed)
    policy = Policy(mode="shared", shared_cap=args.cap, max_per_project=2, max_per_user=None)
    asked = sum(r.count for r in requests)
    print(
        f"{args.projects} projects of {args.users} users asking for {asked} GPUs in all, "
        f"over {args.gpus} GPUs shared by at most {args.cap} projects each"
    )

    samples, granted, refused = run_choose(devices, requests, policy, args.rounds)
    print(
        f"choose: {len(samples)} decisions ({args.rounds} rounds): "
        f"p50={percentile(samples, 0.5):.1f} us p99={percentile(samples, 0.99):.1f} us "
        f"mean={statistics.fmean(samples):.1f} us; per round {granted} granted, {refused} refused"
    )

    store_samples, store_refused = run_store(devices, requests, policy)
    print(
        f"store.allocate (JSON file, file lock, fsync): {len(store_samples)} calls: "
        f"p50={percentile(store_samples, 0.5) / 1000:.2f} ms "
        f"p99={percentile(store_samples, 0.99) / 1000:.2f} ms "
        f"mean={statistics.fmean(store_samples) / 1000:.2f} ms; {store_refused} refused"
    )
    print(f"alloc_us_per_decision={statistics.fmean(samples):.1f}")


if __name__ == "__main__":
    main()
