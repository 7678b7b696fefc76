"""GPU allocator: worked examples of what people read (refusal messages, limits,
types, MIG, restart). The property-based tests are in test_allocator.py."""

from __future__ import annotations

import pytest
from test_allocator import A100, H100, T0, gpu, mig_slice, tick_clock, when

from gpulab_hub.gpus import Device
from gpulab_hub.gpus.allocator import (
    AllocationError,
    AllocationStore,
    Holder,
    Policy,
    Request,
    choose,
)


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


def test_a_damaged_record_without_rebuild_refuses_rather_than_forgets(tmp_path):
    path = tmp_path / "gpus.json"
    path.write_text('{"holdings": {"GPU-0000": [{"owner": "alice"}]}}')
    store = AllocationStore(path)
    with pytest.raises(AllocationError, match=f"{path} is damaged .*next GPU spawn"):
        store.allocate([gpu(0)], Request("bob", "b", 1), Policy())
    assert path.read_text() == '{"holdings": {"GPU-0000": [{"owner": "alice"}]}}'
    with pytest.raises(AllocationError, match="is damaged"):
        store.release("alice", "a")


def test_a_damaged_record_is_moved_aside_and_rebuilt(tmp_path, caplog):
    path = tmp_path / "gpus.json"
    path.write_text('{"holdings": {"GPU-0000": [{"owner": "al')
    rebuilt = {"GPU-0001": (Holder("alice", "vision", T0, T0),)}
    store = AllocationStore(path, clock=lambda: T0 + 60, rebuild=lambda: rebuilt)
    assert store.allocate([gpu(0), gpu(1)], Request("bob", "b", 1), Policy()) == [gpu(0)]
    assert store.holdings() == {**rebuilt, "GPU-0000": (Holder("bob", "b", T0 + 60),)}
    (aside,) = tmp_path.glob("gpus.json.corrupt-*")
    assert aside.read_text() == '{"holdings": {"GPU-0000": [{"owner": "al'
    assert f"{path} is damaged (not JSON" in caplog.text and aside.name in caplog.text


def test_a_fresh_holding_outlives_a_dead_verdict_for_the_grace_period(tmp_path):
    devices = [gpu(0)]
    now = [T0]
    store = AllocationStore(tmp_path / "gpus.json", clock=lambda: now[0])
    store.allocate(devices, Request("alice", "a", 1), Policy())
    dead = lambda o, p: False  # noqa: E731 - no container exists (yet)
    now[0] += 30
    with pytest.raises(AllocationError, match="held by alice/a"):
        store.allocate(devices, Request("bob", "b", 1), Policy(), alive=dead, grace=60)
    now[0] += 31  # a respawn reserves again: its grace starts over
    store.allocate(devices, Request("alice", "a", 1), Policy())
    now[0] += 59
    with pytest.raises(AllocationError, match="held by alice/a"):
        store.allocate(devices, Request("bob", "b", 1), Policy(), alive=dead, grace=60)
    now[0] += 1
    assert store.allocate(devices, Request("bob", "b", 1), Policy(), alive=dead, grace=60)
    assert store.held_by("alice", "a") == []


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
