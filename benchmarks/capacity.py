"""A day of a lab on a few GPUs: today's policy against the queue, fair share and reclaim.

A fixed-seed trace of N users on M GPUs (sessions of work and think times, some
with long jobs they leave running) is replayed twice on a simulated clock (no
sleeping) through gpulab's real allocator record (``AllocationStore`` on a file):

- today: first come first served; a start with no free GPU is refused and the
  user tries again some minutes later; a project keeps its GPU until it has been
  idle for 2 h (or its user stops it).
- new: a start with no free GPU waits in ``QueueStore`` and is granted, in
  fair-share order (``UsageLedger`` hours over the window, ``Budgets``), the
  moment a GPU frees; while anyone waits, ``reclaim.decide`` warns idle holders
  and stops them after the grace time; idle release (``gpu_idle_release``) warns
  a holder idle for that long even when nobody waits and stops it after the
  grace; the 2 h idle timeout stays.

A project's user returning to a project that was reclaimed asks for a GPU again
(that wait counts too). A warned user is assumed not to react (the worst case for
the new policy). Idle: held while the user thinks or is away and no job runs.

    .venv/bin/python benchmarks/capacity.py [--users 15 --gpus 4 --seed 7 --grace 300
                                             --idle-release 1500]

Last lines: ``p95_wait_ratio=<today/new>``, ``idle_held_ratio=<today/new>``,
``jobs_reclaimed=<n>`` (holders stopped while a job ran: must be 0).
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gpulab_hub.gpus import Device
from gpulab_hub.gpus.allocator import AllocationError, AllocationStore, Policy, Request
from gpulab_hub.gpus.queue import QueueStore
from gpulab_hub.gpus.reclaim import Facts, Rules, decide
from gpulab_hub.gpus.spawner import GpuTraits
from gpulab_hub.gpus.usage import Budgets, Record, UsageLedger

MIN, HOUR = 60.0, 3600.0
DAY0 = 1_750_000_000.0 - 1_750_000_000.0 % 86400  # a midnight (UTC): the clock's zero
PROJECT = "main"
TICK = 30.0  # seconds between the hub's checks (culler, reclaim)


# --- the trace -------------------------------------------------------------------


@dataclass
class Session:
    steps: list[tuple[str, float]]  # ("active" | "think" | "job", seconds)
    stop_at_end: bool  # the user stops the project when leaving
    gap: float  # seconds until the user's next session starts


@dataclass
class Person:
    name: str
    arrive: float  # seconds after midnight
    sessions: list[Session]


def trace(users: int, seed: int) -> list[Person]:
    """Each user: arrives in the morning, works in sessions until the evening.

    A fifth of the users are heavy (longer sessions, jobs in most of them)."""
    rng = random.Random(seed)
    people = []
    for n in range(users):
        heavy = n % 5 == 0
        arrive = rng.gauss(10 * HOUR, 1.5 * HOUR)
        sessions, t = [], arrive
        while t < 18 * HOUR:
            steps: list[tuple[str, float]] = []
            for _ in range(rng.randint(3, 5) if heavy else rng.randint(1, 3)):
                steps.append(("active", rng.uniform(2, 12) * MIN))
                steps.append(("think", min(rng.expovariate(1 / (10 * MIN)), 60 * MIN)))
                if rng.random() < (0.2 if heavy else 0.04):
                    steps.append(("job", rng.uniform(30, 90) * MIN))
                    steps.append(("active", rng.uniform(3, 10) * MIN))
            gap = rng.uniform(120, 360) * MIN  # lectures, meetings, other work
            sessions.append(Session(steps, rng.random() < 0.3, gap))
            t += sum(s for _, s in steps) + gap
        people.append(Person(f"user{n:02d}", arrive, sessions))
    return people


# --- the simulation ----------------------------------------------------------------


@dataclass
class User:
    person: Person
    session: int = 0
    step: int = -1
    phase: str = "gone"  # active | think | job | away | waiting | gone
    held: bool = False
    since: float = 0.0  # holding since
    busy_s: float = 0.0  # seconds of this holding with the GPU busy
    idle_since: float = 0.0
    warned_at: float | None = None
    asked_at: float | None = None  # waiting for a GPU since
    last_t: float = 0.0
    waited: float = 0.0
    worked: float = 0.0
    waits: list[float] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.person.name

    @property
    def idle(self) -> bool:
        return self.phase in ("think", "away", "gone", "waiting")


class Lab:
    def __init__(self, people, gpus: int, folder: Path, new: bool, args):
        self.new, self.args = new, args
        self.rng = random.Random(args.seed)  # today's users' retry times
        self.now = 0.0
        self.devices = [
            Device(str(i), f"GPU-{i:08x}-sim", "NVIDIA H100 80GB HBM3", 80 << 30, "9.0")
            for i in range(gpus)
        ]
        clock = lambda: DAY0 + self.now  # noqa: E731
        self.allocs = AllocationStore(folder / "gpu-allocations.json", clock=clock)
        self.queue = QueueStore(folder / "gpu-queue.json", clock=clock)
        self.ledger = UsageLedger(folder / "gpu-usage.jsonl", clock=clock)
        self.budgets = Budgets(default=args.budget)
        self.rules = Rules(
            grace=args.grace, idle_after=args.idle_after, release_after=args.idle_release
        )
        self.policy = Policy()
        self.users = {p.name: User(p) for p in people}
        self.events: list = []
        self.seq = 0
        self.idle_held = self.held_total = 0.0
        self.idle_by = {"think": 0.0, "gone_wait": 0.0, "gone_free": 0.0}
        self.reclaimed = self.jobs_reclaimed = self.warned = self.culled = self.released = 0
        for u in self.users.values():
            self.at(u.person.arrive, "session", u)
        self.at(TICK, "tick", None)

    def at(self, t: float, kind: str, u: User | None) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, u.name if u else ""))

    # bookkeeping: GPU-time held, and held idle, integrated between changes
    def account(self, u: User) -> None:
        dt = self.now - u.last_t
        if u.held:
            self.held_total += dt
            self.idle_held += dt if u.idle else 0.0
            u.busy_s += 0.0 if u.idle else dt
            if u.idle:
                waits = any(x.phase == "waiting" for x in self.users.values())
                why = "think" if u.phase == "think" else "gone_wait" if waits else "gone_free"
                self.idle_by[why] += dt
        if u.phase == "waiting":
            u.waited += dt
        elif u.phase in ("active", "think", "job"):
            u.worked += dt
        u.last_t = self.now

    def set_phase(self, u: User, phase: str) -> None:
        if "waiting" in (phase, u.phase):  # whether anyone waits changes for every holder
            for x in self.users.values():
                self.account(x)
        self.account(u)
        if phase in ("think", "away", "gone") and not u.idle:
            u.idle_since = self.now
        if phase in ("active", "job"):
            u.warned_at = None
        u.phase = phase

    # --- GPUs ---
    def grant(self, u: User) -> None:
        self.account(u)
        u.held, u.since, u.busy_s, u.warned_at = True, self.now, 0.0, None
        u.waits.append(self.now - u.asked_at)
        u.asked_at = None
        self.next_step(u)

    def release(self, u: User) -> None:
        self.account(u)
        if not u.held:
            return
        held = self.now - u.since
        util = 100.0 * u.busy_s / held * 0.8 if held else 0.0
        names = {d.uuid: f"GPU {d.index}" for d in self.devices}
        freed = self.allocs.release(u.name, PROJECT)
        self.ledger.append(
            Record(u.name, PROJECT, x, names[x], DAY0 + u.since, DAY0 + self.now, min(100.0, util))
            for x in freed
        )
        u.held = False
        if self.new:
            self.serve()

    def ask(self, u: User) -> None:
        """The user wants their project running; it holds no GPU."""
        self.set_phase(u, "waiting")
        u.asked_at = self.now
        request = Request(u.name, PROJECT, 1)
        if self.new:
            self.queue.enqueue(request)
            self.serve()
        else:
            self.retry(u)

    def retry(self, u: User) -> None:
        try:
            self.allocs.allocate(self.devices, Request(u.name, PROJECT, 1), self.policy)
        except AllocationError:
            later = self.args.retry_min * MIN * self.rng.uniform(0.6, 1.6)
            self.at(self.now + later, "retry", u)
            return
        self.grant(u)

    def serve(self) -> None:
        if not self.queue.entries():
            return
        hours = self.ledger.hours_by_user(7 * 24 * HOUR, held=self.allocs.holdings())
        for g in self.queue.grant(
            self.allocs, self.devices, self.policy, hours, self.budgets.over(hours)
        ):
            self.grant(self.users[g.entry.owner])

    # --- the user's day ---
    def next_step(self, u: User) -> None:
        s = u.person.sessions[u.session]
        u.step += 1
        if u.step >= len(s.steps):  # the session ends: the user leaves
            self.set_phase(u, "gone")
            if s.stop_at_end:
                self.release(u)
            u.session += 1
            u.step = -1
            if u.session < len(u.person.sessions):
                self.at(self.now + s.gap, "session", u)
            return
        phase, length = s.steps[u.step]
        self.set_phase(u, phase)
        self.at(self.now + length, "step", u)

    def step_done(self, u: User) -> None:
        if u.held:
            self.next_step(u)
            return
        # reclaimed while the user thought: they want it back to go on
        self.ask(u)

    def tick(self) -> None:
        for u in self.users.values():
            self.account(u)
            if u.held and u.idle and self.now - u.idle_since >= self.args.idle_timeout:
                self.culled += 1
                self.release(u)
        if self.new:
            waiting = sum(e.request.count for e in self.queue.entries())
            holders = [
                Facts(
                    u.name,
                    PROJECT,
                    1,
                    busy_kernel=u.phase == "active",
                    running_job=u.phase == "job",
                    gpu_util=0.0 if u.idle else 80.0,
                    idle_since=DAY0 + u.idle_since,
                    warned_at=u.warned_at,
                )  # fmt: skip
                for u in self.users.values()
                if u.held
            ]
            hours = self.ledger.hours_by_user(7 * 24 * HOUR, held=self.allocs.holdings())
            d = decide(holders, waiting, DAY0 + self.now, self.rules, self.budgets.over(hours))
            for f in d.warn:
                self.users[f.owner].warned_at = DAY0 + self.now
                self.warned += 1
            for f in d.withdraw:
                self.users[f.owner].warned_at = None
            for f in d.stop:
                u = self.users[f.owner]
                self.jobs_reclaimed += u.phase == "job"  # from the lab's state, not the facts
                self.reclaimed += 1
                self.released += f.key in d.released
                self.release(u)

    def run(self) -> None:
        while self.events:
            t, _, kind, name = heapq.heappop(self.events)
            self.now = t
            u = self.users.get(name)
            if kind == "tick":
                self.tick()
                busy = any(x.held or x.phase != "gone" for x in self.users.values())
                if self.events or busy:
                    self.at(self.now + TICK, "tick", None)
            elif kind == "session":
                if u.held:
                    self.next_step(u)  # the project still holds its GPU: straight on
                else:
                    self.ask(u)
            elif kind == "step":
                self.step_done(u)
            elif kind == "retry":
                self.retry(u)
        for u in self.users.values():
            self.account(u)


# --- figures ---------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


def jain(xs: list[float]) -> float:
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if any(xs) else 1.0


def figures(lab: Lab) -> dict:
    waits = [w for u in lab.users.values() for w in u.waits]
    shares = [u.worked / (u.worked + u.waited) for u in lab.users.values() if u.worked]
    return {
        "requests": len(waits),
        "median_wait_s": statistics.median(waits) if waits else 0.0,
        "p95_wait_s": pct(waits, 0.95),
        "max_wait_s": max(waits, default=0.0),
        "within_60s": sum(w <= 60 for w in waits) / len(waits) if waits else 1.0,
        "idle_held_h": lab.idle_held / HOUR,
        "held_h": lab.held_total / HOUR,
        "jain": jain(shares),
        "idle_think_h": lab.idle_by["think"] / HOUR,
        "idle_gone_wait_h": lab.idle_by["gone_wait"] / HOUR,
        "idle_gone_free_h": lab.idle_by["gone_free"] / HOUR,
        "warned": lab.warned,
        "reclaimed": lab.reclaimed,
        "released": lab.released,
        "culled_2h": lab.culled,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=15)
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--seed", type=int, default=7)
    traits = GpuTraits.class_traits()  # gpulab's defaults, from the traits themselves

    def default(name: str) -> float:
        return float(traits[name].default_value)

    ap.add_argument(
        "--grace", type=float, default=default("gpu_reclaim_grace"), help="seconds, warning to stop"
    )
    ap.add_argument(
        "--idle-after",
        type=float,
        default=default("gpu_reclaim_idle"),
        help="seconds idle before a warning while someone waits",
    )
    ap.add_argument("--idle-timeout", type=float, default=2 * HOUR, help="both policies' culler")
    ap.add_argument(
        "--idle-release",
        type=float,
        default=default("gpu_idle_release"),
        help="new: seconds idle before a release (0: off)",
    )
    ap.add_argument("--retry-min", type=float, default=5, help="today: mean minutes to retry")
    ap.add_argument("--budget", type=float, default=6, help="GPU-hours per user (the window)")
    args = ap.parse_args()

    people = trace(args.users, args.seed)
    steps = [s for p in people for ss in p.sessions for s in ss.steps]
    print(
        f"{args.users} users on {args.gpus} GPUs, seed {args.seed}: "
        f"{sum(len(p.sessions) for p in people)} sessions, "
        f"{sum(k == 'job' for k, _ in steps)} jobs, "
        f"{sum(t for k, t in steps if k != 'think') / HOUR:.1f} h of GPU work, "
        f"{sum(t for k, t in steps if k == 'think') / HOUR:.1f} h of thinking"
    )
    out = {}
    for name, new in (("today", False), ("new", True)):
        with tempfile.TemporaryDirectory(prefix="gpulabbench-capacity-") as tmp:
            lab = Lab(people, args.gpus, Path(tmp), new, args)
            lab.run()
            out[name] = figures(lab)
            out[name]["jobs_reclaimed"] = lab.jobs_reclaimed
    t, n = out["today"], out["new"]
    rows = [
        ("GPU requests", "requests", "{:.0f}"),
        ("median wait (s)", "median_wait_s", "{:.0f}"),
        ("p95 wait (s)", "p95_wait_s", "{:.0f}"),
        ("longest wait (s)", "max_wait_s", "{:.0f}"),
        ("served within 60 s", "within_60s", "{:.0%}"),
        ("GPU-hours held", "held_h", "{:.1f}"),
        ("GPU-hours held idle", "idle_held_h", "{:.1f}"),
        ("  while its user thought", "idle_think_h", "{:.1f}"),
        ("  user gone, someone waiting", "idle_gone_wait_h", "{:.1f}"),
        ("  user gone, nobody waiting", "idle_gone_free_h", "{:.1f}"),
        ("Jain's fairness index", "jain", "{:.3f}"),
        ("idle holders warned", "warned", "{:.0f}"),
        ("idle holders reclaimed", "reclaimed", "{:.0f}"),
        ("  of them idle release", "released", "{:.0f}"),
        ("stopped by the 2 h idle timeout", "culled_2h", "{:.0f}"),
    ]
    print(f"{'':34}{'today':>10}{'new':>10}")
    for label, key, fmt in rows:
        print(f"{label:34}{fmt.format(t[key]):>10}{fmt.format(n[key]):>10}")
    print(f"(grace {args.grace / 60:g} min after {args.idle_after / 60:g} min idle while someone")
    print(f" waits, or after {args.idle_release / 60:g} min idle (idle release); Jain over")
    print(" each user's share of their day spent working rather than waiting for a GPU)")
    print(
        "idle_held_while_someone_waited_ratio="
        f"{t['idle_gone_wait_h'] / max(n['idle_gone_wait_h'], 1e-9):.2f}"
    )
    print(f"p95_wait_ratio={t['p95_wait_s'] / max(n['p95_wait_s'], 1.0):.2f}")
    print(f"idle_held_ratio={t['idle_held_h'] / max(n['idle_held_h'], 1e-9):.2f}")
    print(f"jobs_reclaimed={n['jobs_reclaimed'] + t['jobs_reclaimed']}")


if __name__ == "__main__":
    main()
