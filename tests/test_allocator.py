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

from gpulab_hub.allocator import (
    MOST,
    AllocationError,
    AllocationStore,
    Holder,
    Policy,
    Request,
    choose,
)
from gpulab_hub.gpus import Device

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
        raw, inode = self.raw(), self.path.stat().st_ino
        got = self.store.allocate(self.devices, r, self.policy)
        assert sorted(d.uuid for d in got) == uuids
        assert self.raw() == raw and self.path.stat().st_ino == inode, "a respawn rewrote"

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


# --- examples: what people read ----------------------------------------------


def store_with(tmp_path, *holdings: tuple[str, str, int, list[Device]], policy=Policy()):
    """A store where each (owner, project, since offset, devices) was allocated in turn."""
    now = [T0]
    store = AllocationStore(tmp_path / "gpus.json", clock=lambda: now[0])
    for owner, project, offset, devs in holdings:
        now[0] = T0 + offset
        assert store.allocate(devs, Request(owner, project, len(devs)), policy) == devs
    return store


def test_busy_gpu_refusal_names_holder_device_and_time(tmp_path):
    devices = [gpu(0), gpu(1, A100)]
    store = store_with(
        tmp_path, ("alice", "vision", 0, [devices[0]]), ("bob", "nlp", 60, [devices[1]])
    )
    before = (tmp_path / "gpus.json").read_bytes()
    with pytest.raises(AllocationError) as e:
        store.allocate(devices, Request("carol", "x", 1), Policy())
    msg = str(e.value)
    assert msg.startswith("carol/x asked for 1 GPU, but 0 of 2 GPUs are free (none).")
    assert f"GPU 0 ({H100}) is held by alice/vision since {when(T0)}" in msg
    assert f"GPU 1 ({A100}) is held by bob/nlp since {when(T0 + 60)}" in msg
    assert [d.index for d, _ in e.value.busy] == ["0", "1"]
    assert (tmp_path / "gpus.json").read_bytes() == before


def test_shared_mode_fills_fewest_held_first_and_names_full_gpus(tmp_path):
    devices = [gpu(i) for i in range(3)]
    policy = Policy(mode="shared", shared_cap=2)
    store = AllocationStore(tmp_path / "gpus.json", clock=tick_clock())
    order = [store.allocate(devices, Request("u", f"p{n}", 1), policy)[0].index for n in range(6)]
    assert order == ["0", "1", "2", "0", "1", "2"]
    with pytest.raises(
        AllocationError, match=r"GPU 0 \(.*\) is full \(2 projects\): u/p0 since .*, u/p3"
    ):
        store.allocate(devices, Request("v", "x", 1), policy)


def test_user_limit_names_the_users_other_projects(tmp_path):
    devices = [gpu(i) for i in range(4)]
    policy = Policy(max_per_user=2)
    store = store_with(tmp_path, ("alice", "a", 0, devices[:2]), policy=policy)
    with pytest.raises(AllocationError) as e:
        store.allocate(devices, Request("alice", "b", 1), policy)
    assert "alice may hold at most 2 GPUs over all projects and holds 2 already" in str(e.value)
    assert f"GPU 1 ({H100}) for alice/a since {when(T0)}" in str(e.value)
    # the same project asking again is not over its owner's limit: it gives up what it had
    assert [d.index for d in store.allocate(devices, Request("alice", "a", 2), policy)] == [
        "0",
        "1",
    ]
    assert store.allocate(devices, Request("bob", "a", 2), policy) == devices[2:]


@pytest.mark.parametrize(
    ("request_", "policy", "match"),
    [
        (Request("a", "p", -1), Policy(), "cannot be negative"),
        (Request("a", "p", 3), Policy(max_per_project=2), "a project may have at most 2 GPUs"),
        (Request("a", "p", 5), Policy(), r"this host has 3 GPUs \(GPU 9 in MIG mode"),
        (Request("a", "p", 1, gpu_type="h100"), Policy(), "no GPU type may be asked for here"),
        (Request("a", "p", 1, gpu_type="V100"), Policy(allowed_types=("H100", "A100")),
         "one may ask for H100, A100 here"),
        (Request("a", "p", 1, gpu_type="A100"), Policy(allowed_types=("A100",)), "has 0 A100 GPUs"),
        (Request("a", "p", mig_profile="1g.10gb"), Policy(allow_mig=False), "MIG slices are not"),
        (Request("a", "p", 2, mig_profile="1g.10gb"), Policy(), "at most one MIG slice"),
        (Request("a", "p", mig_profile="7g.80gb"), Policy(),
         r"0 7g.80gb MIG slices \(MIG profiles here: 1g.10gb, 3g.40gb\)"),
    ],
)  # fmt: skip
def test_requests_that_can_never_be_met(request_, policy, match):
    devices = [gpu(0), gpu(1), gpu(2), mig_slice(9, 0), mig_slice(9, 1, "3g.40gb")]
    with pytest.raises(AllocationError, match=match):
        choose(devices, {}, request_, policy)


def test_kinds_types_and_tie_break():
    devices = [gpu(10), gpu(2, A100), gpu(1), gpu(3, mig=True), mig_slice(4, 0), mig_slice(4, 1)]
    pick = lambda r, p=Policy(allowed_types=("h100", "A100")): [  # noqa: E731
        d.index for d in choose(devices, {}, r, p)
    ]
    assert pick(Request("a", "p", 0)) == []
    assert pick(Request("a", "p", 0, gpu_type="h100")) == []
    assert pick(Request("a", "p", 2)) == ["1", "2"]  # lowest index, "10" after "2"
    assert pick(Request("a", "p", 3)) == ["1", "2", "10"]  # never a slice or a MIG-mode GPU
    assert pick(Request("a", "p", 2, gpu_type="H100")) == ["1", "10"]
    assert pick(Request("a", "p", 1, gpu_type="a100")) == ["2"]
    assert pick(Request("a", "p", mig_profile="1g.10gb")) == ["4:0"]
    held = {"MIG-0004-0": (Holder("b", "q", T0),)}
    mig = Request("a", "p", 1, mig_profile="1g.10gb")
    assert [d.index for d in choose(devices, held, mig, Policy())] == ["4:1"]
    with pytest.raises(AllocationError, match="this host has 3 GPUs"):
        choose(devices, {}, Request("a", "p", 4), Policy())


def test_slices_of_a_gpu_held_whole_are_busy():
    devices = [mig_slice(0, 0), mig_slice(0, 1)]
    held = {"GPU-0000": (Holder("old", "run", T0),)}
    with pytest.raises(AllocationError, match="is held by old/run"):
        choose(devices, held, Request("a", "p", mig_profile="1g.10gb"), Policy())


def test_restart_keeps_holdings_and_respawn_keeps_gpus_and_since(tmp_path):
    devices = [gpu(i) for i in range(3)]
    store = store_with(tmp_path, ("alice", "vision", 0, devices[1:]))
    restarted = AllocationStore(tmp_path / "gpus.json", clock=lambda: T0 + 999)
    assert restarted.holdings() == store.holdings()
    assert restarted.allocate(devices, Request("alice", "vision", 2), Policy()) == devices[1:]
    assert restarted.held_by("alice", "vision") == ["GPU-0001", "GPU-0002"]
    # asking for fewer keeps some, asking for none gives all back
    assert restarted.allocate(devices, Request("alice", "vision", 1), Policy()) == [devices[1]]
    assert restarted.holdings() == {"GPU-0001": (Holder("alice", "vision", T0),)}
    assert restarted.allocate(devices, Request("alice", "vision", 0), Policy()) == []
    assert restarted.holdings() == {}


def test_alive_drops_only_dead_holders_and_none_drops_nothing(tmp_path):
    devices = [gpu(0), gpu(1)]
    store = store_with(tmp_path, ("alice", "a", 0, [devices[0]]), ("bob", "b", 0, [devices[1]]))
    with pytest.raises(AllocationError):
        store.allocate(devices, Request("carol", "c", 1), Policy())  # no alive: nobody dropped
    got = store.allocate(devices, Request("carol", "c", 1), Policy(), alive=lambda o, p: o != "bob")
    assert got == [devices[1]]
    assert store.held_by("alice", "a") == ["GPU-0000"] and store.held_by("bob", "b") == []
    assert store.release_dead(lambda o, p: o == "carol") == [("alice", "a")]
    assert store.held_by("carol", "c") == ["GPU-0001"] and store.release("carol", "c") == [
        "GPU-0001"
    ]
    assert store.holdings() == {} and store.release("carol", "c") == []


def test_an_unreadable_record_refuses_rather_than_forgets(tmp_path):
    path = tmp_path / "gpus.json"
    path.write_text('{"holdings": {"GPU-0000": [{"owner": "alice"}]}}')
    store = AllocationStore(path)
    with pytest.raises(AllocationError, match="cannot be read.*administrator"):
        store.allocate([gpu(0)], Request("bob", "b", 1), Policy())
    assert path.read_text() == '{"holdings": {"GPU-0000": [{"owner": "alice"}]}}'
    with pytest.raises(AllocationError, match="cannot be read"):
        store.release("alice", "a")


def test_crowded_gpus_name_the_first_holders_and_count_the_rest():
    devices = [gpu(0)]
    held = {"GPU-0000": tuple(Holder("u", f"p{n}", T0 + n * 60) for n in range(10))}
    with pytest.raises(AllocationError) as e:
        choose(devices, held, Request("v", "x", 1), Policy(mode="shared", shared_cap=10))
    msg = str(e.value)
    assert f"is full (10 projects): u/p0 since {when(T0)}, u/p1 since {when(T0 + 60)}" in msg
    assert "u/p3 since" in msg and "u/p4" not in msg and msg.endswith(" and 6 more.")
    with pytest.raises(AllocationError, match=r"holds 10 already: GPU 0 \(.*\) for u/p0 since"):
        choose(devices, held, Request("u", "x", 1), Policy(mode="shared", max_per_user=10))
