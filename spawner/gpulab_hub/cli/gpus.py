"""`gpulab gpus`: this host's GPUs and which project holds which, since when."""

from __future__ import annotations

import json
import time

from gpulab_hub import gpus, hubsettings
from gpulab_hub.gpus import allocator


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def report(inv: gpus.Inventory, held: dict[str, tuple[allocator.Holder, ...]]) -> list[str]:
    """Lines for people: one per device, with its holders (pure, for tests)."""
    if not inv.devices:
        lines = [f"No GPUs: {inv.problem}."]
    else:
        lines = [f"NVIDIA driver {inv.driver}, CUDA {inv.cuda}"]
    known = set()
    for d in inv.devices:
        known.add(d.uuid)
        gib = d.memory_total / 2**30
        what = f"GPU {d.index}: {d.name}, {gib:.0f} GiB, compute {d.capability}"
        if d.mig_profile:
            what += f", MIG {d.mig_profile}"
        holders = held.get(d.uuid, ())
        who = "; ".join(f"{h.owner}/{h.project} since {_when(h.since)}" for h in holders)
        who = who or "free"
        lines.append(f"  {what} ({d.uuid}): {who}")
    for uuid in sorted(set(held) - known):
        who = ", ".join(f"{h.owner}/{h.project}" for h in held[uuid])
        lines.append(f"  {uuid} (not seen on this host now): held by {who}")
    return lines


def cmd_gpus(args, environ) -> int:
    path = hubsettings.load(hubsettings.config_file()).allocations_file
    inv = gpus.inventory()
    held = allocator.AllocationStore(path).holdings()
    if args.json:
        out = inv.as_dict()
        out["holdings"] = {
            u: [{"owner": h.owner, "project": h.project, "since": h.since} for h in hs]
            for u, hs in held.items()
        }
        print(json.dumps(out, indent=1))
    else:
        print("\n".join(report(inv, held)))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("gpus", help="list GPUs and which project holds which")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(fn=cmd_gpus)
