"""What each container protection costs: start-to-exit of a short Python run.

Each variant starts the same image with ``python3 -c pass`` ROUNDS times,
interleaved so that load on the machine hits every variant alike, and reports
the median and p90 in milliseconds. The variants add gpulab's protections one
at a time on top of a plain container on the default bridge:

- ``bridge``: Docker's defaults (root in the image's user, default capabilities)
- ``+own network``: gpulab's bridge with inter-container traffic off
- ``+user``: the notebook user forced (1000:100)
- ``+no caps``: every capability dropped
- ``+no-new-privileges``
- ``+pids limit``: 4096
- ``gpulab``: all of the above, as ``objects.container_spec`` builds them
- ``gpulab, no userns``: the same with ``userns_mode=host`` (only on an engine
  with user-namespace remapping: what remapping costs)

Usage: .venv/bin/python benchmarks/protections.py [--rounds 15] [--image gpulab/base:latest]
Every object it makes is named gpulabbench-prot* and removed at the end.
"""

from __future__ import annotations

import argparse
import statistics
import time

from gpulab_hub import host
from gpulab_hub.projects import objects

PREFIX = "gpulabbench-prot"
NETWORK = f"{PREFIX}-net"


def variants(userns: bool) -> dict[str, dict]:
    """Variant name -> (create_container kwargs, host_config kwargs)."""
    steps = [
        ("bridge", {}, {}),
        ("+own network", {}, {"network_mode": NETWORK}),
        ("+user", {"user": "1000:100"}, {}),
        ("+no caps", {}, {"cap_drop": list(objects.CAP_DROP)}),
        ("+no-new-privileges", {}, {"security_opt": list(objects.SECURITY_OPT)}),
        ("+pids limit", {}, {"pids_limit": 4096}),
    ]
    out: dict[str, dict] = {}
    create: dict = {}
    hc: dict = {}
    for name, c, h in steps:
        create = {**create, **c}
        hc = {**hc, **h}
        out[name] = {"create": dict(create), "host_config": dict(hc)}
    out["gpulab"] = out["+pids limit"]
    if userns:
        out["gpulab, no userns"] = {
            "create": dict(create),
            "host_config": {**hc, "userns_mode": "host"},
        }
    return out


def run_once(dk: host.Docker, image: str, v: dict) -> float:
    hc = dk.client.create_host_config(**v["host_config"])
    t0 = time.perf_counter()
    c = dk.call(
        "create_container",
        image,
        command=["python3", "-c", "pass"],
        host_config=hc,
        labels={"gpulab.bench": PREFIX},
        **v["create"],
    )
    dk.call("start", c["Id"])
    status = dk.call("wait", c["Id"], timeout=120)
    elapsed = time.perf_counter() - t0
    dk.call("remove_container", c["Id"], force=True)
    if status.get("StatusCode") != 0:
        raise SystemExit(f"a container of variant {v} exited with {status}")
    return elapsed * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--image", default="gpulab/base:latest")
    args = ap.parse_args()
    dk = host.Docker()
    info = dk.call("info")
    userns = objects.userns_offset(info) != (0, 0)
    host.ensure_network(dk, NETWORK)
    vs = variants(userns)
    times: dict[str, list[float]] = {name: [] for name in vs}
    try:
        for v in vs.values():  # warm-up, not counted
            run_once(dk, args.image, v)
        for _ in range(args.rounds):
            for name, v in vs.items():
                times[name].append(run_once(dk, args.image, v))
    finally:
        for c in dk.call("containers", all=True, filters={"label": f"gpulab.bench={PREFIX}"}):
            dk.call("remove_container", c["Id"], force=True)
        dk.call("remove_network", NETWORK)
    remap = "on" if userns else "off"
    print(f"Docker {info.get('ServerVersion')}, user-namespace remapping {remap}")
    print(f"start-to-exit of `python3 -c pass` in {args.image}, {args.rounds} rounds")
    base = statistics.median(times["bridge"])
    print(f"{'variant':<22} {'p50 ms':>8} {'p90 ms':>8} {'vs bridge':>10}")
    for name, ts in times.items():
        p50 = statistics.median(ts)
        p90 = statistics.quantiles(ts, n=10)[-1]
        print(f"{name:<22} {p50:8.0f} {p90:8.0f} {p50 / base:9.2f}x")
    print(f"protections_p50_ratio={statistics.median(times['gpulab']) / base:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
