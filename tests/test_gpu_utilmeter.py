"""The average utilisation a holding's usage record carries (gpus/utilmeter.py): the
readings of the hub's metrics thread, weighted by time, per holding; gaps and GPUs
NVML cannot measure are left out; a stop takes the average into the ledger."""

from __future__ import annotations

from faults_kit import inventory

from gpulab_hub.db import migrate
from gpulab_hub.gpus import allocator, utilmeter
from gpulab_hub.gpus import spawner as gpu_spawner
from gpulab_hub.gpus.usage import UsageLedger


def held(*rows: tuple[str, str, str]) -> allocator.Held:
    out: dict[str, tuple] = {}
    for uuid, owner, project in rows:
        out[uuid] = (*out.get(uuid, ()), allocator.Holder(owner, project, since=0.0))
    return out


def test_time_weighted_average_per_holding_and_gaps_left_out():
    m = utilmeter.Meter()
    h = held(("GPU-a", "alice", "train"), ("GPU-b", "bob", "eval"))
    m.sample(h, {"GPU-a": 100.0, "GPU-b": None}, 1000.0)  # first reading: no time yet
    m.sample(h, {"GPU-a": 100.0, "GPU-b": None}, 1010.0)  # 10 s at 100 %
    m.sample(h, {"GPU-a": 0.0, "GPU-b": None}, 1040.0)  # 30 s at 0 %
    m.sample(h, {"GPU-a": 100.0, "GPU-b": None}, 1040.0 + utilmeter.GAP + 1)  # a gap: not counted
    assert m.take("alice", "train", "GPU-a") == 25.0
    assert m.take("alice", "train", "GPU-a") is None  # taken once
    assert m.take("bob", "eval", "GPU-b") is None  # NVML could not measure it (MIG, WSL2)
    assert m.take("carol", "x", "GPU-a") is None  # never held


def test_a_stop_writes_the_average_into_the_usage_record(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_spawner, "cached_inventory", lambda: inventory(1))
    monkeypatch.setattr(utilmeter, "METER", utilmeter.Meter())
    s = gpu_spawner.GpuTraits(allocations_file=str(tmp_path / "gpu-allocations.json"))
    migrate.upgrade(gpu_spawner.db_url_of(s))  # the hub's database, as a start leaves it
    store = gpu_spawner.store_of(s)
    store.allocate(
        inventory(1).devices, allocator.Request("alice", "train", 1), gpu_spawner.policy_of(s)
    )
    now = gpu_spawner.clock()
    utilmeter.METER.sample(store.holdings(), {"GPU-0000-fault": 40.0}, now - 20)
    utilmeter.METER.sample(store.holdings(), {"GPU-0000-fault": 80.0}, now - 10)
    gpu_spawner.release(s, "alice", "train")
    (rec,) = UsageLedger(gpu_spawner.db_url_of(s)).records()
    assert (rec.owner, rec.project, rec.util) == ("alice", "train", 80.0)
