"""No GPU is ever held by two projects: the spawner's own reserve/release path
(gpu_spawner.reserve / release, as ProjectSpawner.start, stop and poll call them)
under concurrent spawns, stops, container deaths, hub restarts and a damaged
record, against a recorded Docker engine (tests/faults_kit.py).

The spawner reserves first and creates the container later, on a thread pool that
builds also use: a spawn stays "reserved" (no container yet) across several steps
here, while other spawns reserve around it. Counts (spawns tried, double bookings
seen) are printed at the end of the module (run with -s).
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import faults_kit
import pytest
from faults_kit import PREFIX, RecordedDocker, inventory
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from gpulab_hub import host
from gpulab_hub.gpus import allocator
from gpulab_hub.gpus import spawner as gpu_spawner

T0 = 1_750_000_000.0
PICK = st.integers(0, 99)
KEYS = [(o, p) for o in ("alice", "bob", "carol") for p in ("a", "b", "c")]
COUNTS: Counter = Counter()


@pytest.fixture(scope="module", autouse=True)
def print_counts():
    yield
    print(
        f"\nGPU booking under faults: {COUNTS['tried']} spawns tried "
        f"({COUNTS['concurrent']} in concurrent batches), {COUNTS['granted']} granted, "
        f"{COUNTS['refused']} refused, {COUNTS['stops']} stops, {COUNTS['deaths']} container "
        f"deaths, {COUNTS['restarts']} hub restarts, {COUNTS['damaged']} damaged records; "
        f"double bookings seen: {COUNTS['double']}; live holdings dropped: {COUNTS['dropped']}"
    )


@dataclass
class Spawn:
    uuids: tuple[str, ...]
    assignment: object
    stage: str = "reserved"  # reserved -> running; or abandoned (its hub died), dead
    cid: str = ""


class Spawns(RuleBasedStateMachine):
    """A hub's spawns over time; ``self.spawns`` is what each project was told it holds."""

    def __init__(self):
        super().__init__()
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.dir = Path(tempfile.mkdtemp(prefix="gpulab-booking-", dir=shm))
        self.path = self.dir / "gpu-allocations.json"
        self.now = [T0]
        self.docker = RecordedDocker(clock=lambda: self.now[0])
        self.s = gpu_spawner.GpuTraits(allocations_file=str(self.path))
        self.spawns: dict[tuple[str, str], Spawn] = {}
        self.damaged = False
        self._saved = (gpu_spawner.cached_inventory, gpu_spawner.clock)
        gpu_spawner.clock = lambda: self.now[0]
        gpu_spawner.forget_pending()

    @initialize(n=st.integers(1, 4))
    def host(self, n):
        inv = inventory(n)
        gpu_spawner.cached_inventory = lambda: inv

    # --- what the spawner does -----------------------------------------------------

    def _reserve(self, key, count) -> None:
        """ProjectSpawner._reserve_gpus; a refusal leaves the project stopped."""
        COUNTS["tried"] += 1
        try:
            assignment, devices = gpu_spawner.reserve(
                self.s, self.docker, PREFIX, allocator.Request(*key, count=count)
            )
        except allocator.AllocationError:
            COUNTS["refused"] += 1
            return
        COUNTS["granted"] += 1
        self.spawns[key] = Spawn(tuple(d.uuid for d in devices), assignment)

    def _create(self, key) -> None:
        """The rest of ProjectSpawner.start: the container, with what was reserved."""
        sp = self.spawns[key]
        sp.cid = self.docker.create(*key, sp.assignment)
        self.docker.start(sp.cid)
        sp.stage = "running"

    def _stop(self, key) -> None:
        """ProjectSpawner.stop: the container goes, then its GPUs."""
        self.docker.remove(self.spawns.pop(key).cid)
        gpu_spawner.release(self.s, *key)
        COUNTS["stops"] += 1

    def _free(self) -> list[tuple[str, str]]:
        busy = {k for k, sp in self.spawns.items() if sp.stage in ("reserved", "running")}
        return [k for k in KEYS if k not in self.spawns and k not in busy]

    def _in(self, *stages):
        return sorted(k for k, sp in self.spawns.items() if sp.stage in stages)

    def _pick(self, pick: int, *stages) -> tuple[str, str] | None:
        keys = self._in(*stages)
        return keys[pick % len(keys)] if keys else None

    # Every rule draws from fixed choices and skips what does not apply: which spawn
    # wins a race differs from run to run, and hypothesis replays draws, not threads.

    @rule(
        new=st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from([1, 1, 2, 0])), max_size=6),
        create=st.lists(st.sampled_from(KEYS), max_size=4),
        stop=st.lists(st.sampled_from(KEYS), max_size=2),
    )
    def at_once(self, new, create, stop):
        """Several spawns reserve at once, while others create their containers or stop."""
        free, jobs = self._free(), []
        for key, count in dict(new).items():
            if key in free:
                jobs.append((self._reserve, (key, count)))
        COUNTS["concurrent"] += len(jobs)
        jobs += [(self._create, (k,)) for k in set(create) & set(self._in("reserved"))]
        jobs += [(self._stop, (k,)) for k in set(stop) & set(self._in("running"))]
        barrier = threading.Barrier(len(jobs) or 1)
        errors = []

        def run(fn, args):
            barrier.wait()
            try:
                fn(*args)
            except Exception as e:  # noqa: BLE001 - reported below, with the rule's data
                errors.append(e)

        threads = [threading.Thread(target=run, args=j) for j in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    @rule(key=st.sampled_from(KEYS), count=st.sampled_from([1, 2]))
    def spawn(self, key, count):
        if key in self._free():
            self._reserve(key, count)

    @rule(pick=PICK)
    def container_created(self, pick):
        if key := self._pick(pick, "reserved"):
            self._create(key)

    @rule(pick=PICK)
    def stop(self, pick):
        if key := self._pick(pick, "running"):
            self._stop(key)

    @rule(pick=PICK)
    def container_dies(self, pick):
        """The container disappears (crash with --rm, `docker rm -f`); nobody is told yet."""
        if key := self._pick(pick, "running"):
            self.docker.remove(self.spawns[key].cid)
            self.spawns[key].stage = "dead"
            COUNTS["deaths"] += 1

    @rule(pick=PICK)
    def poll_notices(self, pick):
        """ProjectSpawner.poll (or the hub's check at start): no container, GPUs released."""
        if key := self._pick(pick, "dead", "abandoned"):
            del self.spawns[key]
            gpu_spawner.release(self.s, *key)

    @rule(pick=PICK)
    def hub_restart(self, pick):
        """The hub process dies and starts again: spawns it had under way never finish."""
        if pick % 3:
            return  # rarer than the rest
        gpu_spawner.forget_pending()
        for sp in self.spawns.values():
            if sp.stage == "reserved":
                sp.stage = "abandoned"
        COUNTS["restarts"] += 1

    @rule(seconds=st.sampled_from([5, 60, 3600]))
    def time_passes(self, seconds):
        self.now[0] += seconds

    @rule(
        text=st.sampled_from(["", '{"holdings": {"GPU-0000-fault": [{"owner": 1', "[]", "\0"]),
        pick=PICK,
    )
    def record_damaged(self, text, pick):
        """A half-written or garbled record (a crash, a full disk, an editor)."""
        if pick % 4:
            return
        self.path.write_text(text)
        self.damaged = True
        COUNTS["damaged"] += 1

    # --- what must hold ------------------------------------------------------------

    @invariant()
    def no_gpu_told_to_two_live_projects(self):
        told: dict[str, tuple[str, str]] = {}
        for key, sp in self.spawns.items():
            if sp.stage not in ("reserved", "running"):
                continue
            for u in sp.uuids:
                if u in told:
                    COUNTS["double"] += 1
                    raise AssertionError(f"{u} held by {told[u]} and {key} at once")
                told[u] = key

    @invariant()
    def record_keeps_every_live_holding(self):
        try:
            held = allocator.AllocationStore(self.path).holdings()
        except allocator.AllocationError:
            assert self.damaged, "the record is unreadable, though nobody damaged it"
            return
        self.damaged = False
        for u, hs in held.items():
            assert len(hs) == 1, f"{u} recorded for {[h.key for h in hs]}"
        mine = {}
        for u, hs in held.items():
            mine.setdefault(hs[0].key, set()).add(u)
        for key, sp in self.spawns.items():
            if sp.stage in ("reserved", "running") and mine.get(key, set()) != set(sp.uuids):
                COUNTS["dropped"] += 1
                raise AssertionError(f"{key} holds {sp.uuids}, the record says {mine.get(key)}")

    def teardown(self):
        gpu_spawner.cached_inventory, gpu_spawner.clock = self._saved
        gpu_spawner.forget_pending()
        shutil.rmtree(self.dir, ignore_errors=True)


Spawns.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_spawns_never_double_book = Spawns.TestCase


# --- the same path against the real Docker engine --------------------------------


@pytest.fixture
def engine():
    """The real engine, a one-file image (its containers are created, never started),
    and every container of this test's instance removed at the end."""
    dk = host.Docker()
    if not dk.reachable():
        pytest.skip("no Docker engine answers here")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("empty")
        tar.addfile(info, io.BytesIO(b""))
    dk.call("import_image_from_data", buf.getvalue(), repository=f"{REAL}/project", tag="x")
    yield dk
    for c in dk.call("containers", all=True, filters={"label": f"gpulab.instance={REAL}"}):
        dk.call("remove_container", c["Id"], force=True)
    dk.call("remove_image", f"{REAL}/project:x", force=True)


REAL = f"{os.environ.get('GPULAB_TEST_PREFIX', PREFIX)}-booking"


def test_a_created_container_keeps_its_gpu_across_restarts_and_a_damaged_record(
    engine, tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(gpu_spawner, "cached_inventory", lambda: inventory(1))
    now = [time.time()]  # Docker stamps containers with the real clock
    monkeypatch.setattr(gpu_spawner, "clock", lambda: now[0])
    gpu_spawner.forget_pending()
    record = tmp_path / "gpu-allocations.json"
    s = gpu_spawner.GpuTraits(allocations_file=str(record), gpu_isolation="runtime")

    def reserve(owner, project):
        return gpu_spawner.reserve(s, engine.call, REAL, allocator.Request(owner, project, 1))

    alice, _ = reserve("alice", "a")
    # Under way, no container yet (a build may be running): nobody else gets the GPU.
    with pytest.raises(allocator.AllocationError, match="held by alice/a"):
        reserve("bob", "b")
    spec = faults_kit.project_spec("alice", "a", alice, prefix=REAL, network="bridge")
    spec["host_config"] = engine.client.create_host_config(**spec["host_config"])
    engine.call("create_container", **spec)  # created, not running
    gpu_spawner.forget_pending()  # the hub restarts ...
    now[0] += 3600  # ... long after the grace period: the container alone keeps the GPU
    with pytest.raises(allocator.AllocationError, match="held by alice/a"):
        reserve("bob", "b")
    record.write_text('{"version": 1, "holdings": {"GPU-0000-fault": [{"ow')  # torn write
    with pytest.raises(allocator.AllocationError, match="held by alice/a"):
        reserve("bob", "b")
    assert "is damaged (not JSON" in caplog.text
    assert "rebuilt from the project containers" in caplog.text
    assert len(list(tmp_path.glob("gpu-allocations.json.corrupt-*"))) == 1
    assert gpu_spawner.store_of(s).held_by("alice", "a") == [alice.uuids[0]]
    # The container goes without the hub noticing: its GPU is free for the next spawn.
    for c in engine.call("containers", all=True, filters={"label": f"gpulab.instance={REAL}"}):
        engine.call("remove_container", c["Id"], force=True)
    bob, _ = reserve("bob", "b")
    assert bob.uuids == alice.uuids
    gpu_spawner.forget_pending()
