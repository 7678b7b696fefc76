"""The GPU allocator as pure logic, and its store on a real file (no GPU needed).

Property tests drive random hosts (whole GPUs, GPUs in MIG mode with slices),
random policies and random sequences of allocate / release / hub restart /
dead containers, and check the invariants after every step against a model
written from the rules, not from the code.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from gpulab_hub.gpus import Device
from gpulab_hub.gpus.allocator import (
    MOST,
    AllocationError,
    AllocationStore,
    Holder,
    Policy,
    Request,
    choose,
)

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-40GB"
T4 = "Tesla T4"
T0 = 1_750_000_000.0  # a fixed "since" for the examples


def when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def gpu(i: int, name: str = H100, mig: bool = False) -> Device:
    return Device(
        index=str(i), uuid=f"GPU-{i:04d}", name=name, memory_total=80 << 30, capability="9.0",
        mig_mode=mig,
    )  # fmt: skip


def mig_slice(i: int, j: int, profile: str = "1g.10gb", name: str = A100) -> Device:
    return Device(
        index=f"{i}:{j}", uuid=f"MIG-{i:04d}-{j}", name=f"{name} MIG {profile}",
        memory_total=10 << 30, capability="8.0", mig_mode=True, parent_uuid=f"GPU-{i:04d}",
        mig_profile=profile,
    )  # fmt: skip


def tick_clock(start: float = T0):
    t = [start]

    def clock() -> float:
        t[0] += 60
        return t[0]

    return clock


# --- strategies ---------------------------------------------------------------

PROFILES = ["1g.10gb", "3g.40gb"]
OWNERS = ["alice", "bob", "carol"]
PROJECTS = ["a", "b", "c"]


@st.composite
def hosts(draw, sizes=(4, 2, 6, 3, 1, 5, 0)) -> list[Device]:
    devices: list[Device] = []
    for i in range(draw(st.sampled_from(sizes))):
        name = draw(st.sampled_from([H100, H100, A100, T4]))
        if draw(st.integers(0, 3)) == 0:  # MIG mode, with 0-3 slices
            profiles = draw(st.lists(st.sampled_from(PROFILES), max_size=3))
            if not profiles:
                devices.append(gpu(i, name, mig=True))
            devices += [mig_slice(i, j, p, name) for j, p in enumerate(profiles)]
        else:
            devices.append(gpu(i, name))
    return devices


def policies(zero=True):
    return st.builds(
        Policy,
        mode=st.sampled_from(["exclusive", "shared"]),
        shared_cap=st.sampled_from([2, 3, 1]),
        max_per_user=st.sampled_from([None, 3, 2, 4, 1, *[0][:zero]]),
        max_per_project=st.sampled_from([None, 2, 3, 1, *[0][:zero]]),
        allowed_types=st.lists(st.sampled_from(["H100", "a100", "T4"]), unique=True).map(tuple)
        | st.just(("H100", "A100")),
        allow_mig=st.booleans() | st.just(True),
    )


@st.composite
def requests(draw) -> Request:
    """Mostly well-formed requests (0-2 GPUs), sometimes a type, a MIG slice or nonsense."""
    mig = draw(st.sampled_from(["", "", "", "", "", "", *PROFILES, "7g.80gb"]))
    count = draw(st.sampled_from([1, 0, 1, 2] if mig else [1, 0, 2, 1, 0, 2, 1, 3, 4, -1]))
    return Request(
        owner=draw(st.sampled_from(OWNERS)),
        project=draw(st.sampled_from(PROJECTS)),
        count=count,
        gpu_type=draw(st.sampled_from(["", "", "", "", "", "", "h100", "A100", "t4", "V100"])),
        mig_profile=mig,
    )


def plain_requests():
    """The common case: whole GPUs, no type (contention and limits, rather than nonsense)."""
    return st.builds(
        Request, st.sampled_from(OWNERS), st.sampled_from(PROJECTS), st.sampled_from([1, 2, 0, 3])
    )


# --- the rules, written out once more as the oracle ---------------------------


def pool(devices: list[Device], r: Request) -> list[Device]:
    """Devices of the kind the request asks for."""
    out = []
    for d in devices:
        if r.gpu_type and r.gpu_type.lower() not in d.name.lower():
            continue
        if r.mig_profile and d.parent_uuid and d.mig_profile == r.mig_profile:
            out.append(d)
        elif not r.mig_profile and not d.parent_uuid and not d.mig_mode:
            out.append(d)
    return out


def statically_refused(devices, r: Request, p: Policy) -> bool:
    """Refused whoever holds what: a malformed request, or more than exists."""
    need = 1 if r.mig_profile else r.count
    return (
        r.count < 0
        or (bool(r.mig_profile) and (not p.allow_mig or r.count > 1))
        or (need > 0 and p.max_per_project is not None and need > p.max_per_project)
        or (
            need > 0
            and bool(r.gpu_type)
            and r.gpu_type.lower() not in {t.lower() for t in p.allowed_types}
        )
        or len(pool(devices, r)) < need
    )


def others_of_owner(held, r: Request) -> list[tuple[str, Holder]]:
    return [
        (u, h)
        for u, hs in held.items()
        for h in hs
        if h.owner == r.owner and h.project != r.project
    ]


def free_for(devices, held, r: Request, p: Policy) -> list[Device]:
    cap = 1 if p.mode == "exclusive" else p.shared_cap
    me = (r.owner, r.project)
    return [
        d
        for d in pool(devices, r)
        if len([h for h in held.get(d.uuid, ()) if (h.owner, h.project) != me]) < cap
    ]


def feasible(devices, held, r: Request, p: Policy) -> bool:
    need = 1 if r.mig_profile else r.count
    if statically_refused(devices, r, p):
        return False
    if need == 0:
        return True
    if p.max_per_user is not None and len(others_of_owner(held, r)) + need > p.max_per_user:
        return False
    return len(free_for(devices, held, r, p)) >= need


def check_result(devices, held, r: Request, p: Policy, got: list[Device]) -> None:
    need = 1 if r.mig_profile else r.count
    event(f"granted {need} ({'MIG' if r.mig_profile else 'GPU'}, {p.mode})")
    assert len(got) == need == len({d.uuid for d in got})
    assert all(d in pool(devices, r) for d in got)
    free = free_for(devices, held, r, p)
    assert all(d in free for d in got), "landed on a busy device"
    if need > 1:
        assert all(not d.parent_uuid and not d.mig_mode for d in got)


def assert_named(holders: list[Holder], message: str) -> None:
    """The first MOST holders named with their time, the rest counted."""
    for h in holders[:MOST]:
        assert f"{h.owner}/{h.project} since {when(h.since)}" in message
    if len(holders) > MOST:
        assert f" and {len(holders) - MOST} more" in message


def check_refusal_message(devices, held, r: Request, p: Policy, message: str) -> None:
    assert f"{r.owner}/{r.project}" in message
    if statically_refused(devices, r, p):
        event("refused: malformed or more than exists")
        return
    need = 1 if r.mig_profile else r.count
    if p.max_per_user is not None and len(others_of_owner(held, r)) + need > p.max_per_user:
        event(f"refused: user limit, {len(others_of_owner(held, r))} held elsewhere")
        assert_named([h for _, h in others_of_owner(held, r)], message)
        return
    # refused for busy devices: every device of the kind that is not free is
    # named, with everyone else who holds it
    event(f"refused: busy, {p.mode}")
    free = free_for(devices, held, r, p)
    for d in pool(devices, r):
        if d not in free:
            assert f" {d.index} ({d.name})" in message
            others = [
                h for h in held.get(d.uuid, ()) if (h.owner, h.project) != (r.owner, r.project)
            ]
            assert_named(others, message)


def check_invariants(devices, held, p: Policy) -> None:
    per_project: dict[tuple[str, str], list[str]] = {}
    for u, hs in held.items():
        assert hs, "a device recorded with nobody holding it"
        keys = [(h.owner, h.project) for h in hs]
        assert len(keys) == len(set(keys)), "one project twice on one device"
        assert len(hs) <= (1 if p.mode == "exclusive" else p.shared_cap)
        for k in keys:
            per_project.setdefault(k, []).append(u)
    by_uuid = {d.uuid: d for d in devices}
    per_owner: dict[str, int] = {}
    for (owner, _), uuids in per_project.items():
        per_owner[owner] = per_owner.get(owner, 0) + len(uuids)
        if p.max_per_project is not None:
            assert len(uuids) <= p.max_per_project
        kinds = [by_uuid[u] for u in uuids]
        if len(kinds) > 1:  # several devices: whole GPUs only
            assert all(not d.parent_uuid and not d.mig_mode for d in kinds)
    if p.max_per_user is not None:
        assert all(n <= p.max_per_user for n in per_owner.values())


# --- pure choose --------------------------------------------------------------


@st.composite
def holdings_for(draw, devices: list[Device], policy: Policy):
    """Holdings that a sequence of successful choose calls produces."""
    held: dict[str, tuple[Holder, ...]] = {}
    for r in draw(st.lists(plain_requests() | requests(), max_size=16)):
        try:
            got = choose(devices, held, r, policy)
        except AllocationError:
            continue
        held = {u: tuple(h for h in hs if h.project != r.project or h.owner != r.owner)
                for u, hs in held.items()}  # fmt: skip
        held = {u: hs for u, hs in held.items() if hs}
        for d in got:
            held[d.uuid] = held.get(d.uuid, ()) + (Holder(r.owner, r.project, T0),)
    return held


@settings(max_examples=400, deadline=None)
@given(st.data(), hosts(), policies(), plain_requests() | requests())
def test_choose_follows_the_rules_and_is_pure(data, devices, policy, request):
    held = data.draw(holdings_for(devices, policy))
    check_invariants(devices, held, policy)
    snapshot = json.dumps({u: [h.__dict__ for h in hs] for u, hs in held.items()})
    try:
        got = choose(devices, held, request, policy)
    except AllocationError as e:
        assert not feasible(devices, held, request, policy)
        check_refusal_message(devices, held, request, policy, str(e))
    else:
        assert feasible(devices, held, request, policy)
        check_result(devices, held, request, policy, got)
        assert choose(devices, held, request, policy) == got  # deterministic
    assert json.dumps({u: [h.__dict__ for h in hs] for u, hs in held.items()}) == snapshot


# --- the store, step by step --------------------------------------------------


class StoreMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        # tmpfs where there is one: fsync costs nothing there, the code path is the same
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.dir = Path(tempfile.mkdtemp(prefix="gpulab-alloc-", dir=shm))
        self.path = self.dir / "gpus.json"
        self.clock = tick_clock()
        self.store = AllocationStore(self.path, clock=self.clock)
        self.model: dict[tuple[str, str], set[str]] = {}
        self.last: dict[tuple[str, str], tuple[Request, list[str]]] = {}

    @initialize(devices=hosts(sizes=(4, 3, 5, 2, 6)), policy=policies(zero=False))
    def setup(self, devices, policy):
        self.devices, self.policy = devices, policy

    def raw(self) -> bytes:
        return self.path.read_bytes() if self.path.exists() else b""

    def _allocate(self, r: Request, alive=None, dead=frozenset()):
        before, raw = self.store.holdings(), self.raw()
        seen = {
            k: set(v) for k, v in self.model.items() if (k not in dead or k == (r.owner, r.project))
        }
        live = {u: tuple(h for h in hs if (h.owner, h.project) in seen) for u, hs in before.items()}
        live = {u: hs for u, hs in live.items() if hs}
        try:
            got = self.store.allocate(self.devices, r, self.policy, alive=alive)
        except AllocationError as e:
            assert self.raw() == raw and self.store.holdings() == before, "a refusal changed things"
            assert not feasible(self.devices, live, r, self.policy)
            check_refusal_message(self.devices, live, r, self.policy, str(e))
            return
        assert feasible(self.devices, live, r, self.policy)
        check_result(self.devices, live, r, self.policy, got)
        key = (r.owner, r.project)
        mine = self.model.get(key, set())
        still = [d for d in free_for(self.devices, live, r, self.policy) if d.uuid in mine]
        need = len(got)
        kept = {d.uuid for d in got} & mine
        assert len(kept) == min(len(still), need), "a respawn did not keep what still fits"
        self.model = {k: v for k, v in seen.items() if k != key}
        if got:
            self.model[key] = {d.uuid for d in got}
            self.last[key] = (r, sorted(d.uuid for d in got))
        else:
            self.last.pop(key, None)
        for k in dead:
            self.last.pop(k, None)
        after = self.store.holdings()
        since_before = {
            u: h.since for u, hs in before.items() for h in hs if (h.owner, h.project) == key
        }
        for u in kept:  # kept devices keep their "since"
            assert [h.since for h in after[u] if (h.owner, h.project) == key] == [since_before[u]]

    @rule(r=requests())
    def allocate(self, r):
        self._allocate(r)

    @rule(owner=st.sampled_from(OWNERS), project=st.sampled_from(PROJECTS), count=st.integers(1, 2))
    def allocate_plain(self, owner, project, count):  # the common case, to build up contention
        self._allocate(Request(owner, project, count))

    @rule(
        r=requests(),
        dead=st.sets(st.tuples(st.sampled_from(OWNERS), st.sampled_from(PROJECTS)), max_size=3),
    )
    def allocate_with_dead_containers(self, r, dead):
        calls = []

        def alive(owner, project):
            calls.append((owner, project))
            return (owner, project) not in dead

        self._allocate(r, alive=alive, dead=frozenset(dead))
        assert len(calls) == len(set(calls)), "alive asked twice about one project"
        assert (r.owner, r.project) not in calls

    @rule(owner=st.sampled_from(OWNERS), project=st.sampled_from(PROJECTS))
    def release(self, owner, project):
        freed = self.store.release(owner, project)
        assert set(freed) == self.model.pop((owner, project), set())
        self.last.pop((owner, project), None)
        assert self.store.held_by(owner, project) == []

    @rule()
    def hub_restart(self):
        before = self.store.holdings()
        self.store = AllocationStore(self.path, clock=self.clock)
        assert self.store.holdings() == before

    @precondition(lambda self: self.last)
    @rule(data=st.data())
    def respawn_gets_the_same_devices(self, data):
        key = data.draw(st.sampled_from(sorted(self.last)))
        r, uuids = self.last[key]
        before = json.loads(self.raw())
        got = self.store.allocate(self.devices, r, self.policy)
        assert sorted(d.uuid for d in got) == uuids
        after = json.loads(self.raw())

        def strip(record):  # the record without the respawned project's reservation time
            for hs in record["holdings"].values():
                for h in hs:
                    if (h["owner"], h["project"]) == key:
                        assert h.pop("reserved") >= h["since"]
            return record

        after, before = strip(after), strip(before)
        assert after == before, "a respawn changed more than its reservation time"

    @invariant()
    def invariants_hold_on_disk(self):
        if not hasattr(self, "devices"):
            return
        held = AllocationStore(self.path).holdings()
        check_invariants(self.devices, held, self.policy)
        model = {}
        for u, hs in held.items():
            for h in hs:
                model.setdefault((h.owner, h.project), set()).add(u)
        assert model == {k: v for k, v in self.model.items() if v}
        for (owner, project), uuids in model.items():
            assert sorted(self.store.held_by(owner, project)) == sorted(uuids)

    def teardown(self):
        shutil.rmtree(self.dir, ignore_errors=True)


StoreMachine.TestCase.settings = settings(
    max_examples=50,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_store_sequences = StoreMachine.TestCase


# --- several hubs, threads and processes on one file ---------------------------


def _churn(args) -> tuple[list[str], dict[str, list[str]]]:
    """One hub process allocating and releasing its projects' GPUs, over and over.

    Returns what went wrong (a grant that the record no longer shows right after)
    and the GPUs each of its projects holds at the end, by what it was told.
    """
    path, devices, owner, seed = args
    rng, store = random.Random(seed), AllocationStore(Path(path))
    wrong: list[str] = []
    mine: dict[str, list[str]] = {}
    for i in range(30):
        project = f"p{i % 4}"
        try:
            got = store.allocate(devices, Request(owner, project, rng.choice([1, 1, 2])), Policy())
        except AllocationError:
            pass
        else:
            mine[project] = sorted(d.uuid for d in got)
            if sorted(store.held_by(owner, project)) != mine[project]:
                wrong.append(f"{owner}/{project} was given {mine[project]}, the record lost it")
        if rng.random() < 0.4:
            gone = rng.choice(sorted(mine) or ["p0"])
            store.release(owner, gone)
            mine.pop(gone, None)
    return wrong, mine


def check_file(path: Path, devices: list[Device]) -> dict:
    held = AllocationStore(path).holdings()
    check_invariants(devices, held, Policy())
    assert not list(path.parent.glob(".*.tmp")), "a temporary file was left behind"
    return held


@pytest.mark.parametrize("one_store", [False, True], ids=["store-per-thread", "shared-store"])
def test_threads_never_double_book(tmp_path, one_store):
    devices = [gpu(i) for i in range(4)]
    path = tmp_path / "gpus.json"
    shared = AllocationStore(path)
    results: dict[int, list[str]] = {}
    start = threading.Barrier(12)

    def worker(n: int) -> None:
        start.wait()
        store = shared if one_store else AllocationStore(path)
        try:
            got = store.allocate(devices, Request(f"u{n % 3}", f"p{n}", 1 + n % 2), Policy())
            results[n] = [d.uuid for d in got]
        except AllocationError:
            results[n] = []

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    handed_out = [u for got in results.values() for u in got]
    assert len(handed_out) == len(set(handed_out)) == 4  # every GPU, each once
    held = check_file(path, devices)
    assert {u: hs[0].project for u, hs in held.items()} == {
        u: f"p{n}" for n, got in results.items() for u in got
    }


def test_processes_never_double_book(tmp_path):
    devices = [gpu(i) for i in range(3)]
    path = tmp_path / "gpus.json"
    with multiprocessing.get_context("fork").Pool(3) as pool:
        out = pool.map(_churn, [(str(path), devices, f"hub{n}", n) for n in range(3)])
    assert [wrong for wrong, _ in out] == [[], [], []]
    told = {(f"hub{n}", p): uuids for n, (_, mine) in enumerate(out) for p, uuids in mine.items()}
    handed_out = [u for uuids in told.values() for u in uuids]
    assert len(handed_out) == len(set(handed_out)), f"one GPU told to two projects: {told}"
    held = check_file(path, devices)
    assert _regroup(held) == told  # the record and what each hub was told agree


def _regroup(held) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for u, hs in sorted(held.items()):
        for h in hs:
            out.setdefault((h.owner, h.project), []).append(u)
    return out
