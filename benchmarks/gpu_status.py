"""GPU status benchmark: gpulab-jupyter's sampler and API against the anchor's way.

    .venv/bin/python benchmarks/gpu_status.py [--clients 50] [--seconds 20] [--json FILE]

1. Sampler cost per tick per GPU (µs) and process-list cost, in this process.
2. CPU share of the sampler thread at 1 Hz, and the lag of an asyncio loop
   beside it (the sampler must never block a loop).
3. The anchor's way (jupyterlab-nvdashboard: NVML on the event loop, one
   callback per chart every 100 ms): cost per chart per GPU, share of the loop
   it takes, loop lag. GPU hosts only.
4. API latency p50/p99 with --clients concurrent pollers (one keep-alive
   connection each, one request a second, phases spread over the second)
   against a real `jupyter server` with the extension; on a GPU host also
   against the anchor's poll route.
5. RSS of an idle server with and without the extension.

On a machine without a GPU, 1-3 measure the no-GPU path and the anchor is
skipped. The last line is ``api_p99_ms=<float>`` (gpulab-jupyter's route).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from gpu_status_load import Server, pct, poll  # beside this script

HERE = Path(__file__).resolve().parent
ROUTE = "/api/gpulab/v1/gpu?interval=1"


def sampler_cost(ticks: int = 300) -> dict:
    from gpulab_jupyter.sampler import GPUSampler

    s = GPUSampler(environ=dict(os.environ))
    t0 = time.perf_counter()
    s._setup()
    out = {"setup_ms": round((time.perf_counter() - t0) * 1e3, 1), "gpus": len(s._devices)}
    if not s._devices:
        out["no_gpu"] = s._state["message"]
        return out
    per_tick = []
    for _ in range(ticks):
        t = time.perf_counter()
        s._tick(do_procs=False, do_slow=False)
        per_tick.append((time.perf_counter() - t) * 1e6 / len(s._devices))
    for _ in range(10):
        s._read_processes(time.time())
    s.stop()
    out.update(
        tick_us_per_gpu_mean=round(statistics.mean(per_tick), 1),
        tick_us_per_gpu_p99=round(pct(per_tick, 99), 1),
        process_read_ms=round(s.stats["proc_seconds"] / s.stats["proc_reads"] * 1e3, 2),
    )
    return out


async def loop_lag(seconds: float, step: float = 0.005) -> list[float]:
    """How late a 5 ms sleep wakes up, in ms, for ``seconds``."""
    loop, lags = asyncio.get_running_loop(), []
    end = loop.time() + seconds
    while loop.time() < end:
        t = loop.time()
        await asyncio.sleep(step)
        lags.append((loop.time() - t - step) * 1e3)
    return lags


def sampler_at_1hz(seconds: float) -> dict:
    from gpulab_jupyter.sampler import GPUSampler

    s = GPUSampler(environ=dict(os.environ), interval=1.0, process_interval=5.0)
    s.start()
    cpu0 = time.process_time()
    lags = asyncio.run(loop_lag(seconds))
    cpu = time.process_time() - cpu0
    s.stop()
    thread_cpu = s.stats["tick_cpu_seconds"] + s.stats["proc_cpu_seconds"]
    return {
        "seconds": seconds,
        "ticks": s.stats["ticks"],
        "sampler_cpu_percent": round(100 * thread_cpu / seconds, 4),
        "process_cpu_percent_incl_probe": round(100 * cpu / seconds, 2),
        "loop_lag_ms_p99": round(pct(lags, 99), 3),
        "loop_lag_ms_max": round(max(lags), 3),
    }


def anchor_in_process(seconds: float) -> dict:
    """nvdashboard's way: three charts reading NVML on the loop every 100 ms."""
    sys.path.insert(0, str(HERE))
    import nvdashboard_anchor as anchor
    import pynvml

    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    cost = {c.__name__: [] for c in anchor.CHARTS}

    async def run() -> list[float]:
        async def chart(c):
            while True:
                t = time.perf_counter()
                c(handles)
                cost[c.__name__].append((time.perf_counter() - t) * 1e6 / len(handles))
                await asyncio.sleep(anchor.TICK_MS / 1000)

        tasks = [asyncio.create_task(chart(c)) for c in anchor.CHARTS]
        lags = await loop_lag(seconds)
        for t in tasks:
            t.cancel()
        return lags

    lags = asyncio.run(run())
    busy = sum(sum(v) * len(handles) / 1e6 for v in cost.values())
    return {
        "chart_us_per_gpu_mean": {k: round(statistics.mean(v), 1) for k, v in cost.items()},
        "loop_busy_percent": round(100 * busy / seconds, 2),
        "loop_lag_ms_p99": round(pct(lags, 99), 3),
        "loop_lag_ms_max": round(max(lags), 3),
    }


def api_latency(clients: int, seconds: float, gpu: bool) -> dict:
    out = {}
    with Server() as s:
        out["gpulab"] = asyncio.run(poll(s.port, ROUTE, s.token, clients, seconds))
    if gpu:
        env = {"PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        extra = (
            "--ServerApp.jpserver_extensions",
            "gpulab_jupyter=False",
            "--ServerApp.jpserver_extensions",
            "nvdashboard_anchor=True",
        )
        with Server(*extra, env=env) as s:
            path = "/api/anchor/gpu"
            out["anchor"] = asyncio.run(poll(s.port, path, s.token, clients, seconds))
    return out


def idle_rss() -> dict:
    import requests

    out = {}
    for name, extra in (
        ("without", ("--ServerApp.jpserver_extensions", "gpulab_jupyter=False")),
        ("with", ()),
    ):
        with Server(*extra) as s:
            for path in ("/api/status", ROUTE):
                requests.get(
                    f"http://127.0.0.1:{s.port}{path}",
                    headers={"Authorization": f"token {s.token}"},
                    timeout=5,
                )
            time.sleep(4)  # let the sampler start and settle
            out[f"{name}_extension_mib"] = round(
                statistics.median(s.rss_mib() for _ in range(3)), 1
            )
    out["added_mib"] = round(out["with_extension_mib"] - out["without_extension_mib"], 1)
    # Compiling a module from source costs RSS that an installed package (with its .pyc)
    # does not: say whether that was so here.
    out["bytecode_cached"] = bytecode_cached()
    nvml = nvml_itself_mib()
    if nvml is not None:  # what any NVML user pays, whoever calls it
        out["nvml_library_itself_mib"] = nvml
        out["extension_own_mib"] = round(out["added_mib"] - nvml, 1)
    return out


def bytecode_cached() -> bool:
    import importlib.util

    import gpulab_contract.nvml
    import gpulab_jupyter.nvml
    import gpulab_jupyter.sampler

    return all(
        Path(importlib.util.cache_from_source(m.__file__)).exists()
        for m in (gpulab_contract.nvml, gpulab_jupyter.nvml, gpulab_jupyter.sampler)
    )


NVML_RSS = """
import ctypes
def rss():
    return next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmRSS"))
before = rss()
ctypes.CDLL("libnvidia-ml.so.1").nvmlInit_v2()
print((rss() - before) / 1024)
"""


def nvml_itself_mib() -> float | None:
    """RSS that loading and initialising NVML adds to a bare Python (None without a driver)."""
    done = subprocess.run([sys.executable, "-c", NVML_RSS], capture_output=True, text=True)
    return round(float(done.stdout), 1) if done.returncode == 0 else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    results = {"machine": f"{os.cpu_count()} CPUs", "sampler": sampler_cost()}
    gpu = results["sampler"]["gpus"] > 0
    print("sampler:", json.dumps(results["sampler"]), flush=True)
    results["sampler_1hz"] = sampler_at_1hz(min(args.seconds, 10))
    print("sampler at 1 Hz:", json.dumps(results["sampler_1hz"]), flush=True)
    if gpu:
        results["anchor"] = anchor_in_process(min(args.seconds, 10))
        print("anchor (nvdashboard way):", json.dumps(results["anchor"]), flush=True)
    else:
        print("anchor (nvdashboard way): skipped, no GPU here", flush=True)
    results["api"] = api_latency(args.clients, args.seconds, gpu)
    for name, r in results["api"].items():
        print(f"api {name} ({args.clients} pollers, 1/s each):", json.dumps(r), flush=True)
    results["rss"] = idle_rss()
    print("idle server RSS:", json.dumps(results["rss"]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print(f"api_p99_ms={results['api']['gpulab']['p99_ms']}")


if __name__ == "__main__":
    threading.current_thread().name = "benchmark"
    main()
