"""`gpulab gpus`: this host's GPUs and which project holds which, since when, and the
starts waiting for a GPU in the order they will be served."""

from __future__ import annotations

import json
import time

from gpulab_hub import gpus, hubsettings
from gpulab_hub.gpus import allocator, queue, usage


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


def waiting_lines(
    ranked: list[queue.Entry], hours: dict[str, float], over: frozenset[str], now: float
) -> list[str]:
    """Lines for people: the waiting starts in the order they will be served (pure)."""
    if not ranked:
        return ["Nobody waits for a GPU."]
    lines = ["Waiting for a GPU, in the order they will be served:"]
    for n, e in enumerate(ranked, 1):
        asked = e.request.mig_profile or f"{e.request.count} GPU(s)"
        if e.request.gpu_type:
            asked += f" of type {e.request.gpu_type}"
        used = f"{hours.get(e.owner, 0.0):.1f} GPU-h in the window"
        if e.owner in over:
            used += ", over budget"
        mins = max(0, int((now - e.enqueued_at) // 60))
        lines.append(f"  {n}. {e.owner}/{e.project}: {asked}, waiting {mins} min ({used})")
    return lines


def _queue(where: hubsettings.Layout, held) -> tuple[list, dict, frozenset]:
    """The queue in serving order, the users' GPU-hours, those over budget. Groups'
    budgets need the hub's database: here only users' own and the default count."""
    if not where.queue_file.exists():
        return [], {}, frozenset()
    entries = queue.QueueStore(where.queue_file).entries()
    hours = usage.of_layout(where).hours_by_user(where.usage_window, held=held)
    b = dict(where.budget_hours)
    budgets = usage.Budgets(
        users={k: v for k, v in b.items() if not k.startswith("group:") and k != "*"},
        default=b.get("*"),
    )
    over = budgets.over(hours)
    return queue.order(entries, hours, over), hours, over


def cmd_gpus(args, environ) -> int:
    where = hubsettings.load(hubsettings.config_file())
    inv = gpus.inventory()
    held = allocator.AllocationStore(where.allocations_file).holdings()
    ranked, hours, over = _queue(where, held)
    if args.json:
        out = inv.as_dict()
        out["holdings"] = {
            u: [{"owner": h.owner, "project": h.project, "since": h.since} for h in hs]
            for u, hs in held.items()
        }
        out["queue"] = [
            {"owner": e.owner, "project": e.project, "gpus": e.request.count,
             "gpu_type": e.request.gpu_type, "mig_profile": e.request.mig_profile,
             "since": e.enqueued_at}
            for e in ranked
        ]  # fmt: skip
        print(json.dumps(out, indent=1))
    else:
        lines = report(inv, held) + waiting_lines(ranked, hours, over, time.time())
        print("\n".join(lines))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("gpus", help="list GPUs and which project holds which")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(fn=cmd_gpus)
