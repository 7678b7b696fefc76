"""Reclaim stops only what the queue can use: the keeper warns and stops an idle holder
only for a waiting start that the freed GPU is then granted to, by the queue's own grant
(``queue.next_grant``: per-user limits, budgets, fair-share order), one holder per grant.

The attack (a user queues many starts to stop every idle holder on the host) is run as
the keeper runs it: its settings from the hub's configuration, the queue, allocation and
reclaim records as real files, the hub a recorded stand-in (no GPU, no Docker: GPUs are
records here). The property test draws random hosts, holders and waiters and simulates
the grant that follows each plan with the real grant."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from traitlets.config import Config

from gpulab_hub import gpus, hubconfig
from gpulab_hub import settings as gpulab_settings
from gpulab_hub.db import migrate
from gpulab_hub.gpus import keeper, queue, reclaim, reclaimrecord
from gpulab_hub.gpus.allocator import AllocationStore, Holder, Policy, Request
from gpulab_hub.gpus.keeper import HubState, Server

NOW = 1_750_000_000.0
MIN = 60.0
H100 = "NVIDIA H100 80GB HBM3"


def gpu(i: int) -> gpus.Device:
    return gpus.Device(str(i), f"GPU-{i:04d}", H100, 80 << 30, "9.0", minor=i)


def two_gpus() -> gpus.Inventory:
    return gpus.Inventory(devices=[gpu(0), gpu(1)], driver="570.0", cuda="12.8")


class RecordedHub:
    """The hub's REST API as the keeper uses it: its state, and the starts and stops
    asked of it (recorded)."""

    def __init__(self, state: HubState):
        self.state_now = state
        self.calls: list[tuple] = []

    def state(self) -> HubState:
        return self.state_now

    def start(self, owner, project, options) -> int:
        self.calls.append(("start", owner, project))
        return 202

    def stop(self, owner, project) -> int:
        self.calls.append(("stop", owner, project))
        return 204

    def members(self, groups):
        return {}


def keeper_of_hub(tmp_path: Path, **spawner) -> keeper.Keeper:
    """The keeper a hub with these ProjectSpawner traits starts (its service's
    environment, read back as the service reads it), on two GPUs."""
    c = Config()
    (tmp_path / "hub").mkdir(exist_ok=True)
    c.JupyterHub.db_url = f"sqlite:///{tmp_path / 'hub' / 'jupyterhub.sqlite'}"
    migrate.upgrade(c.JupyterHub.db_url)  # the hub's database, as a start leaves it
    c.ProjectSpawner.allocations_file = str(tmp_path / "hub" / "gpu-allocations.json")
    c.ProjectSpawner.gpu_reclaim_idle = 10 * MIN
    c.ProjectSpawner.gpu_reclaim_grace = 10 * MIN
    c.ProjectSpawner.gpu_idle_release = 0.0  # off: only the queue reclaims
    for k, v in spawner.items():
        setattr(c.ProjectSpawner, k, v)
    keeper.configure(c, hubconfig.complete(c, gpulab_settings.DEFAULT))
    (svc,) = c.JupyterHub.services
    k = keeper.Keeper.of(gpulab_settings.of_service(svc["environment"]))
    k.inventory = two_gpus  # the host's GPUs, as NVML would list them
    return k


def running(idle_min: float) -> Server:
    return Server(running=True, last_activity=NOW - idle_min * MIN)


def test_one_user_queueing_two_starts_stops_only_the_holder_her_one_allowed_gpu_needs(tmp_path):
    """Two GPUs, gpu_max_per_user=1. The victim is idle in two projects holding both;
    the attacker queues two projects. Before: both of the victim's projects were warned
    and stopped, the attacker got one GPU, her second start was refused by the limit,
    and the other GPU stayed free for nobody. Now one project is warned and stopped, the
    attacker's first start is granted its GPU, and the victim keeps the other."""
    k = keeper_of_hub(tmp_path, gpu_max_per_user=1)
    alloc = AllocationStore(k.allocations_file)
    for i, project in enumerate(("acquisition-due-diligence", "quarterly")):
        alloc.allocate([gpu(i)], Request("victim", project, 1), Policy(max_per_user=2))
    q = queue.QueueStore(k.queue_file, clock=lambda: NOW - 60)
    q.enqueue(Request("mallory", "one", 1))
    q.enqueue(Request("mallory", "two", 1))
    state = HubState(
        frozenset({"victim", "mallory"}),
        {
            ("victim", "acquisition-due-diligence"): running(30),
            ("victim", "quarterly"): running(20),
            ("mallory", "one"): Server(pending="spawn"),
            ("mallory", "two"): Server(pending="spawn"),
        },
    )
    fake = RecordedHub(state)
    p = k.look(fake, NOW)
    assert [w.key for w in p.warn] == [("victim", "acquisition-due-diligence")]
    record = reclaimrecord.ReclaimRecord(reclaimrecord.path_of(k.allocations_file))
    assert set(record.warnings()) == {("victim", "acquisition-due-diligence")}
    assert reclaimrecord.stops_of(k.allocations_file, "victim") == {
        "acquisition-due-diligence": NOW + 10 * MIN
    }
    # the grace passes, both still idle: one project stopped
    k.look(fake, NOW + 10 * MIN)
    assert fake.calls == [("stop", "victim", "acquisition-due-diligence")]
    # its stop frees GPU 0 (the spawner releases it), and the queue's own grant runs
    alloc.release("victim", "acquisition-due-diligence")
    grants = q.grant(alloc, two_gpus().devices, Policy(max_per_user=1), {})
    assert [(g.entry.key, [d.index for d in g.devices]) for g in grants] == [
        (("mallory", "one"), ["0"])
    ]
    assert [e.key for e in q.entries()] == [("mallory", "two")]  # waits: her limit
    assert alloc.held_by("victim", "quarterly") == ["GPU-0001"]
    # mallory's first project runs; her second still waits: the victim's other project
    # is never warned for it, however long the keeper looks
    del state.servers[("victim", "acquisition-due-diligence")]
    fake.calls.clear()
    for minutes in (11, 30, 60):
        t = NOW + minutes * MIN
        state.servers[("mallory", "one")] = Server(running=True, last_activity=t)  # in use
        p = k.look(fake, t)
        assert p.warn == () and p.stop == ()
    assert fake.calls == []
    assert record.warnings() == {}


def test_a_start_the_host_can_never_meet_or_a_user_over_her_limit_stops_nobody(tmp_path):
    """A waiting start that the grant would refuse whatever is freed (her limit is
    reached by a running project) warns nobody; a second waiter that the grant serves
    gets exactly one holder."""
    k = keeper_of_hub(tmp_path, gpu_max_per_user=1)
    alloc = AllocationStore(k.allocations_file)
    alloc.allocate([gpu(0)], Request("victim", "idle", 1), Policy())
    alloc.allocate([gpu(1)], Request("mallory", "busy", 1), Policy())
    q = queue.QueueStore(k.queue_file, clock=lambda: NOW - 60)
    q.enqueue(Request("mallory", "more", 1))
    state = HubState(
        frozenset({"victim", "mallory", "carol"}),
        {
            ("victim", "idle"): running(30),
            ("mallory", "busy"): running(0),
            ("mallory", "more"): Server(pending="spawn"),
            ("carol", "fit"): Server(pending="spawn"),
        },
    )
    assert k.look(RecordedHub(state), NOW).warn == ()
    q.enqueue(Request("carol", "fit", 1))
    assert [w.key for w in k.look(RecordedHub(state), NOW + 1).warn] == [("victim", "idle")]


def test_a_holder_stopping_for_a_start_counts_toward_it_no_second_holder_is_warned():
    """The keeper stopped an idle holder for the one waiting start; while that stop is
    under way its GPU still shows as held. No other idle holder is warned for it."""
    two = (gpu(0), gpu(1))
    held = {d.uuid: (Holder(o, "p", NOW - 3600),) for d, o in zip(two, ("ann", "bob"), strict=True)}
    host = keeper.Host(two, held, Policy())
    state = HubState(
        frozenset({"ann", "bob", "cat", "dan"}),
        {
            ("ann", "p"): Server(pending="stop", last_activity=NOW - 40 * MIN),
            ("bob", "p"): running(30),
            ("cat", "w"): Server(pending="spawn"),
        },
    )
    waits = [queue.Entry(Request("cat", "w", 1), NOW - 60)]
    rules = reclaim.Rules(grace=10 * MIN, idle_after=10 * MIN)
    assert keeper.plan(waits, state, host, {}, NOW, rules) == keeper.Plan()
    # a second start waiting: bob's GPU is what it gets
    more = [*waits, queue.Entry(Request("dan", "x", 1), NOW - 30)]
    state.servers[("dan", "x")] = Server(pending="spawn")
    assert [w.key for w in keeper.plan(more, state, host, {}, NOW, rules).warn] == [("bob", "p")]


# --- the property: no stop without a grant that follows it ------------------------------

USERS = ["ann", "bob", "cat", "dan"]
PROJECTS = ["p", "q", "r"]


@st.composite
def hosts(draw):
    """A host of 1-4 GPUs, who holds which (busy or idle), who waits for what, and the
    allocator's policy and fair-share standing."""
    n = draw(st.integers(1, 4))
    devices = [gpu(i) for i in range(n)]
    shared = draw(st.booleans())
    policy = Policy(
        mode="shared" if shared else "exclusive",
        shared_cap=draw(st.integers(1, 3)),
        max_per_user=draw(st.none() | st.integers(1, 3)),
        max_per_project=draw(st.none() | st.integers(1, 3)),
    )
    cap = policy.shared_cap if shared else 1
    held: dict[str, tuple[Holder, ...]] = {}
    facts: dict[tuple[str, str], reclaim.Facts] = {}
    for d in devices:
        for _ in range(draw(st.integers(0, cap))):
            key = (draw(st.sampled_from(USERS)), draw(st.sampled_from(PROJECTS)))
            if any(h.key == key for h in held.get(d.uuid, ())):
                continue
            held[d.uuid] = held.get(d.uuid, ()) + (Holder(*key, NOW - 3600),)
            if key not in facts:
                facts[key] = reclaim.Facts(
                    *key,
                    gpu_util=draw(st.sampled_from([0.0, 0.0, 50.0])),  # idle, or busy
                    idle_since=NOW - draw(st.sampled_from([1, 20, 90])) * MIN,
                    warned_at=draw(st.none() | st.just(NOW - 15 * MIN)),
                )
    facts = {
        key: reclaim.Facts(**{**vars(f), "gpus": sum(key in {h.key for h in hs}
                                                     for hs in held.values())})
        for key, f in facts.items()
    }  # fmt: skip
    waiting = draw(st.lists(
        st.tuples(st.sampled_from(USERS), st.sampled_from(["w", "x", "y"]), st.integers(1, 3)),
        max_size=5, unique_by=lambda t: t[:2],
    ))  # fmt: skip
    entries = [queue.Entry(Request(o, p, c), NOW - 100 + i) for i, (o, p, c) in enumerate(waiting)]
    usage = {u: draw(st.sampled_from([0.0, 5.0, 50.0])) for u in USERS}
    over = frozenset(draw(st.sets(st.sampled_from(USERS))))
    return devices, held, policy, list(facts.values()), entries, usage, over


def freed(held, keys):
    return {u: tuple(h for h in hs if h.key not in keys) for u, hs in held.items()}


def granted(entries, devices, held, policy, usage, over):
    return queue.next_grant(entries, devices, held, policy, usage, over)


@settings(max_examples=500, deadline=None)
@given(hosts())
def test_every_planned_stop_is_followed_by_a_grant_that_uses_the_gpu_it_frees(host):
    devices, held, policy, facts, entries, usage, over = host
    rules = reclaim.Rules(grace=10 * MIN, idle_after=10 * MIN)
    need = queue.reclaim_for(entries, devices, held, policy, usage, over)
    d = reclaim.decide(facts, need, NOW, rules, over)
    chosen = {f.key for f in d.warn + d.stop}
    before = granted(entries, devices, held, policy, usage, over)
    after = granted(entries, devices, freed(held, chosen), policy, usage, over)
    new = [g for g in after if g.entry.key not in {b.entry.key for b in before}]
    if chosen:
        assert new, "holders chosen, and no start granted that was not granted anyway"
    # each chosen holder frees a device that a grant that follows takes
    taken = {dev.uuid for g in after for dev in g.devices}
    for key in chosen:
        mine = {u for u, hs in held.items() if any(h.key == key for h in hs)}
        assert mine & taken, f"{key} would be stopped for nobody"
    # none too many: without any one of them, fewer starts are granted
    for key in chosen:
        fewer = granted(entries, devices, freed(held, chosen - {key}), policy, usage, over)
        assert len(fewer) < len(after), f"{key} is stopped although the grants need it not"
    # no more holders stopped than GPUs granted to starts that follow
    assert len(chosen) <= sum(len(g.devices) for g in new)
    # a busy holder (its GPU in use) is never chosen
    for f in d.warn + d.stop:
        assert f.gpu_util is not None and f.gpu_util < rules.busy_util
    # and reclaim still serves the queue: on a plain host (one GPU a holder, one a
    # start, no limits) as many starts follow as there are idle holders to serve them
    idle = [
        f for f in facts
        if not reclaim.in_use(f, rules.busy_util) and NOW - f.idle_since >= rules.idle_after
        and (f.warned_at is None or f.idle_since <= f.warned_at)
    ]  # fmt: skip
    plain = (
        policy.mode == "exclusive" and policy.max_per_user is None
        and all(f.gpus == 1 for f in facts) and all(e.request.count == 1 for e in entries)
    )  # fmt: skip
    if plain:
        assert len(new) == len(chosen) == min(len(entries) - len(before), len(idle))
