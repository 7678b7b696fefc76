"""The GPU queue through ProjectSpawner's own start path (``_reserve_gpus``, as ``start``
calls it) and its stop path (``stop``'s queue cancel, ``release`` as stop and poll
call it), on a host of two GPUs given as plain data (faults_kit.inventory) and a
recorded Docker engine: no GPU, no NVML, no hub.

What a user notices: the third start for two GPUs waits and the spawn page says
where it stands and who holds the GPUs; it starts within about two seconds of a
release; Stop takes a waiting start out of the queue; a stop leaves a usage record;
many starts at once never share a GPU; a start the host can never satisfy is refused
at once with today's words.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from types import SimpleNamespace

import pytest
from faults_kit import PREFIX, RecordedDocker, inventory

from gpulab_hub import blocking
from gpulab_hub.db import migrate
from gpulab_hub.gpus import allocator, waiting
from gpulab_hub.gpus import spawner as gpu_spawner
from gpulab_hub.gpus.queue import QueueStore
from gpulab_hub.gpus.usage import UsageLedger
from gpulab_hub.spawner import ProjectSpawner


@pytest.fixture
def host(tmp_path, monkeypatch):
    """Two GPUs, the hub's three GPU files in a fresh folder, no spawn under way."""
    monkeypatch.setattr(gpu_spawner, "cached_inventory", lambda: inventory(2))
    gpu_spawner.forget_pending()
    db_url = f"sqlite:///{tmp_path / 'jupyterhub.sqlite'}"  # the hub's database, upgraded
    migrate.upgrade(db_url)
    yield SimpleNamespace(dir=tmp_path, docker=RecordedDocker(), db_url=db_url)
    gpu_spawner.forget_pending()


def spawner(host, owner: str, project: str, admin: bool = False, **settings) -> ProjectSpawner:
    sp = ProjectSpawner(
        allocations_file=str(host.dir / "gpu-allocations.json"),
        queue_file=str(host.dir / "gpu-queue.json"),
        records_dir=str(host.dir),  # the hub's database: jupyterhub.sqlite there
        gpu_isolation="runtime",
        prefix=PREFIX,
        **settings,
    )
    sp.user = SimpleNamespace(name=owner, groups=[], db=None, admin=admin)
    sp.orm_spawner = SimpleNamespace(name=project, display_name=project, server=None)
    sp._docker = host.docker
    sp._progress_events = []
    return sp


def said(sp: ProjectSpawner) -> list[str]:
    return [e["message"] for e in sp._progress_events]


def holdings(host) -> dict[str, list[str]]:
    raw = json.loads((host.dir / "gpu-allocations.json").read_text())["holdings"]
    return {u: [f"{h['owner']}/{h['project']}" for h in hs] for u, hs in raw.items()}


async def off(fn, *args):
    """The test's own reads and changes of the hub's records, off the event loop as the
    hub's are (the loop guard is strict in tests)."""
    return await blocking.run(blocking.RECORDS, fn, *args)


async def until(check, timeout: float = 5.0):
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.05)


async def test_the_third_start_waits_says_its_place_and_starts_within_2s_of_a_release(host):
    alice, bob = spawner(host, "alice", "train"), spawner(host, "bob", "sweep")
    await alice._reserve_gpus({"gpus": 1})
    await bob._reserve_gpus({"gpus": 1})
    carol, dave = spawner(host, "carol", "fit"), spawner(host, "dave", "eval")
    c = asyncio.create_task(carol._reserve_gpus({"gpus": 1}))
    await until(lambda: any(m.startswith("waiting for a GPU") for m in said(carol)))
    d = asyncio.create_task(dave._reserve_gpus({"gpus": 1}))
    await until(lambda: any(m.startswith("waiting for a GPU") for m in said(dave)))
    assert said(carol)[-1] == (
        "waiting for a GPU: next in line; GPU 0 is in use by another project; "
        "GPU 1 is in use by another project"
    )
    assert said(dave)[-1].startswith("waiting for a GPU: 1 ahead; GPU 0 is in use by another")
    assert not c.done() and not d.done()
    assert [e.project for e in await off(QueueStore(host.dir / "gpu-queue.json").entries)] == [
        "fit",
        "eval",
    ]

    freed_at = time.monotonic()
    await off(gpu_spawner.release, alice, "alice", "train")  # alice stops (ProjectSpawner.stop)
    await asyncio.wait_for(c, 5)
    assert time.monotonic() - freed_at < 2.0
    assert carol._gpus.uuids == ("GPU-0000-fault",)  # the one alice freed
    assert "Reserved GPU 0 (NVIDIA H100 80GB HBM3, GPU-0000-fault)" in said(carol)
    assert holdings(host) == {"GPU-0000-fault": ["carol/fit"], "GPU-0001-fault": ["bob/sweep"]}
    # dave moved up; carol's project is in his way, unnamed
    await until(lambda: said(dave)[-1].startswith("waiting for a GPU: next in line"))
    assert "carol" not in said(dave)[-1] and "fit" not in said(dave)[-1]

    # alice's holding is in the usage ledger: her project, her GPU, from, to
    (rec,) = await off(UsageLedger(host.db_url).records)
    assert (rec.owner, rec.project, rec.uuid) == ("alice", "train", "GPU-0000-fault")
    assert rec.label == "GPU 0 (NVIDIA H100 80GB HBM3)"
    assert rec.start <= rec.end <= time.time()

    # dave's Stop while he waits (ProjectSpawner.stop cancels his entry): his start
    # ends with words, the queue is empty, and bob's release goes to nobody
    assert await off(waiting.cancel, dave, "dave", "eval")
    with pytest.raises(allocator.AllocationError, match="left the GPU queue without a GPU"):
        await asyncio.wait_for(d, 5)
    assert await off(QueueStore(host.dir / "gpu-queue.json").entries) == []
    await off(gpu_spawner.release, bob, "bob", "sweep")
    assert holdings(host) == {"GPU-0000-fault": ["carol/fit"]}


async def test_a_waiting_user_is_told_of_her_own_projects_only_and_an_admin_of_everyones(host):
    """docs/security.md: only admins see others' GPU use. The spawn page's words (its
    progress events, which JupyterHub's progress API sends and the home page's row
    repeats) name another user's project, and how long it has been idle, to no one but
    an admin; the user's own projects are named."""
    from gpulab_hub.home import web as home_web

    victim = spawner(host, "victim", "acquisition-due-diligence")
    await victim._reserve_gpus({"gpus": 1})
    mine = spawner(host, "carol", "first")
    await mine._reserve_gpus({"gpus": 1})
    idle = {("victim", "acquisition-due-diligence"): 12.4}
    carol = spawner(host, "carol", "fit")
    carol._idle_holders = lambda: idle
    boss = spawner(host, "root", "audit", admin=True)
    boss._idle_holders = lambda: idle
    c = asyncio.create_task(carol._reserve_gpus({"gpus": 1}))
    await until(lambda: any(m.startswith("waiting for a GPU") for m in said(carol)))
    b = asyncio.create_task(boss._reserve_gpus({"gpus": 1}))
    await until(lambda: any(m.startswith("waiting for a GPU") for m in said(boss)))
    assert said(carol)[-1] == (
        "waiting for a GPU: next in line; GPU 0 is in use by another project, idle 12 min; "
        "GPU 1 is held by carol/first (in use)"
    )
    assert said(boss)[-1].split("; ", 1)[1] == (  # after its place (fair share: first)
        "GPU 0 is held by victim/acquisition-due-diligence (idle 12 min); "
        "GPU 1 is held by carol/first (in use)"
    )
    # the home page's row says what the spawn page says
    carol._spawn_pending = True  # JupyterHub's mark of a start under way
    row = home_web._waiting(carol)
    assert row == said(carol)[-1].removeprefix(home_web.WAITING)
    assert "victim" not in row and "diligence" not in row
    for t in (c, b):
        t.cancel()
    await asyncio.gather(c, b, return_exceptions=True)

    # with the queue off, the refusal names nobody else's project either
    plain = spawner(host, "dave", "eval", gpu_queue=False)
    with pytest.raises(allocator.AllocationError) as refused:
        await plain._reserve_gpus({"gpus": 1})
    assert "victim" not in str(refused.value) and "carol" not in str(refused.value)
    assert "GPU 0 (NVIDIA H100 80GB HBM3) is held by another project" in str(refused.value)
    admin = spawner(host, "root", "eval", admin=True, gpu_queue=False)
    with pytest.raises(allocator.AllocationError, match="victim/acquisition-due-diligence"):
        await admin._reserve_gpus({"gpus": 1})


async def test_a_cancelled_start_leaves_the_queue(host):
    """JupyterHub's DELETE on a pending spawn cancels the start's task: it leaves the
    queue, and the release that comes later goes to the next in line, not to it."""
    first, second = spawner(host, "alice", "a"), spawner(host, "bob", "b")
    await first._reserve_gpus({"gpus": 2})
    waiter = spawner(host, "carol", "c")
    task = asyncio.create_task(waiter._reserve_gpus({"gpus": 1}))
    await until(lambda: any(m.startswith("waiting for a GPU") for m in said(waiter)))
    nxt = asyncio.create_task(second._reserve_gpus({"gpus": 1}))
    await until(lambda: any(m.startswith("waiting for a GPU: 1 ahead") for m in said(second)))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [e.owner for e in await off(QueueStore(host.dir / "gpu-queue.json").entries)] == ["bob"]
    await off(gpu_spawner.release, first, "alice", "a")
    await asyncio.wait_for(nxt, 5)
    assert "carol/c" not in sum(holdings(host).values(), [])


async def test_a_start_the_host_can_never_satisfy_is_refused_at_once(host):
    sp = spawner(host, "alice", "big")
    with pytest.raises(allocator.AllocationError, match="this host has 2 GPUs"):
        await asyncio.wait_for(sp._reserve_gpus({"gpus": 3}), 2)
    assert not (host.dir / "gpu-queue.json").exists()


async def test_with_the_queue_off_a_full_host_refuses_with_todays_words(host):
    await spawner(host, "alice", "a")._reserve_gpus({"gpus": 2})
    sp = spawner(host, "bob", "b", gpu_queue=False)
    with pytest.raises(allocator.AllocationError, match="0 of 2 GPUs are free") as refused:
        await sp._reserve_gpus({"gpus": 1})
    assert "is held by another project" in str(refused.value)  # not alice/a: bob is no admin
    boss = spawner(host, "root", "b", admin=True, gpu_queue=False)
    with pytest.raises(allocator.AllocationError, match="held by alice/a since"):
        await boss._reserve_gpus({"gpus": 1})


async def test_many_starts_at_once_never_share_a_gpu_and_all_are_served(host):
    sps = [spawner(host, f"u{i}", "p") for i in range(8)]
    tasks = [asyncio.create_task(sp._reserve_gpus({"gpus": 1})) for sp in sps]
    served: list[str] = []
    while len(served) < len(sps):
        done = [sp for sp, t in zip(sps, tasks, strict=True) if t.done()]
        for sp in done:
            if sp.user.name in served:
                continue
            tasks[sps.index(sp)].result()
            held = holdings(host)
            assert all(len(hs) == 1 for hs in held.values()), held  # never two on a GPU
            assert len(held) <= 2
            served.append(sp.user.name)
            await off(gpu_spawner.release, sp, sp.user.name, "p")  # it ran, then stopped
        await asyncio.sleep(0.05)
    assert sorted(served) == sorted(sp.user.name for sp in sps)
    assert await off(QueueStore(host.dir / "gpu-queue.json").entries) == []
    assert len(await off(UsageLedger(host.db_url).records)) == 8


async def test_fair_share_serves_the_user_with_less_recent_gpu_time_first(host):
    ledger = UsageLedger(host.db_url)
    from gpulab_hub.gpus.usage import Record

    now = time.time()
    used = Record("heavy", "x", "GPU-0000-fault", "GPU 0", now - 7200, now - 3600)
    await off(ledger.append, [used])
    holder = spawner(host, "alice", "a")
    await holder._reserve_gpus({"gpus": 2})
    heavy, light = spawner(host, "heavy", "h"), spawner(host, "light", "l")
    h = asyncio.create_task(heavy._reserve_gpus({"gpus": 1}))
    await until(lambda: any(m.startswith("waiting") for m in said(heavy)))
    lt = asyncio.create_task(light._reserve_gpus({"gpus": 1}))
    await until(lambda: any(m.startswith("waiting") for m in said(light)))
    # light came second but used less: light is next in line
    await until(lambda: said(heavy)[-1].startswith("waiting for a GPU: 1 ahead"))
    await off(gpu_spawner.release, holder, "alice", "a")
    await asyncio.wait_for(asyncio.gather(h, lt), 5)
    assert {heavy._gpus.uuids[0], light._gpus.uuids[0]} == {"GPU-0000-fault", "GPU-0001-fault"}


async def test_the_home_page_knows_which_projects_wait_for_a_gpu(host, monkeypatch):
    from gpulab_hub import hubsettings
    from gpulab_hub.home import facts

    await spawner(host, "alice", "a")._reserve_gpus({"gpus": 2})
    waiter = spawner(host, "bob", "queued")
    task = asyncio.create_task(waiter._reserve_gpus({"gpus": 1}))
    await until(lambda: any(m.startswith("waiting for a GPU") for m in said(waiter)))
    where = hubsettings.from_spawner(waiter)
    monkeypatch.setattr(facts, "_device_names", lambda: {})
    found = await asyncio.to_thread(facts.projects, where, "bob", ["queued", "other"])
    assert found["queued"].gpu_waiting and not found["other"].gpu_waiting
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    found = await asyncio.to_thread(facts.projects, where, "bob", ["queued"])
    assert not found["queued"].gpu_waiting


async def test_the_waiting_words_say_how_long_an_idle_holder_has_been_idle(host):
    """The spawn page names a holder idle past gpu_reclaim_idle by its minutes, from the
    last activity its server reported to the hub (the hub's own database)."""
    from datetime import UTC, datetime, timedelta

    from jupyterhub import orm

    db = orm.new_session_factory("sqlite:///:memory:")()
    now = datetime.now(UTC).replace(tzinfo=None)
    for name, project, idle in (("alice", "train", 35), ("bob", "sweep", 2)):
        user = orm.User(name=name)
        db.add(user)
        db.commit()
        sp = orm.Spawner(user=user, name=project, server=orm.Server())
        sp.last_activity = now - timedelta(minutes=idle)
        db.add(sp)
    db.commit()
    await spawner(host, "alice", "train")._reserve_gpus({"gpus": 1})
    await spawner(host, "bob", "sweep")._reserve_gpus({"gpus": 1})
    carol = spawner(host, "carol", "fit")
    carol.user = SimpleNamespace(name="carol", groups=[], db=db)
    task = asyncio.create_task(carol._reserve_gpus({"gpus": 1}))
    await until(lambda: any(m.startswith("waiting for a GPU") for m in said(carol)))
    assert said(carol)[-1] == (
        "waiting for a GPU: next in line; GPU 0 is in use by another project, idle 35 min; "
        "GPU 1 is in use by another project"
    )
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_twenty_waiting_starts_share_one_serve_a_tick_and_never_hold_the_docker_pool(
    host, monkeypatch
):
    """Review item 1: each waiting start once served the whole queue every second on the
    Docker pool (both locks, the ledger read twice). Now the queue is served once a tick
    for the hub, its record work on the records pool; only the container listing is
    Docker's."""
    await spawner(host, "alice", "a")._reserve_gpus({"gpus": 2})  # the host is full
    serves, threads = [], {"serve": set(), "see": set(), "live": set()}
    real_serve, real_see, real_live = waiting.serve, waiting.see, gpu_spawner.Liveness

    def serve(*args, **kw):
        serves.append(time.monotonic())
        threads["serve"].add(threading.current_thread().name.rsplit("_", 1)[0])
        return real_serve(*args, **kw)

    def see(*args, **kw):
        threads["see"].add(threading.current_thread().name.rsplit("_", 1)[0])
        return real_see(*args, **kw)

    def live(*args, **kw):
        threads["live"].add(threading.current_thread().name.rsplit("_", 1)[0])
        return real_live(*args, **kw)

    monkeypatch.setattr(waiting, "serve", serve)
    monkeypatch.setattr(waiting, "see", see)
    monkeypatch.setattr(gpu_spawner, "Liveness", live)
    sps = [spawner(host, f"w{i}", "p") for i in range(20)]
    tasks = [asyncio.create_task(sp._reserve_gpus({"gpus": 1})) for sp in sps]
    await until(lambda: all(any(m.startswith("waiting") for m in said(sp)) for sp in sps), 60)
    serves.clear()
    started = time.monotonic()
    await asyncio.sleep(4 * waiting.TICK)
    took = time.monotonic() - started
    # one serve a tick (and one more at most for a tick under way), not one per waiter
    assert len(serves) <= took / waiting.TICK + 2, (len(serves), took)
    assert threads["serve"] == threads["see"] == {"gpulab-records"}
    assert threads["live"] == {"gpulab-docker"}  # only the container listing is Docker's
    # the two GPUs freed still go to two waiting starts within a few ticks
    await off(gpu_spawner.release, sps[0], "alice", "a")
    await until(lambda: sum(t.done() for t in tasks) == 2, 10)
    assert all(t.exception() is None for t in tasks if t.done())
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_stop_does_its_record_work_on_the_records_pool_and_records_the_usage(
    host, monkeypatch
):
    """The queue's cancel and the GPUs' release (the usage ledger's row) of a stop run on
    the records pool; the container's own stop stays DockerSpawner's."""
    from dockerspawner import DockerSpawner

    sp = spawner(host, "alice", "train")
    await sp._reserve_gpus({"gpus": 1})
    seen: dict[str, str] = {}
    real_cancel, real_release = waiting.cancel, gpu_spawner.release

    def where(name, fn):
        def call(*args, **kw):
            seen[name] = threading.current_thread().name.rsplit("_", 1)[0]
            return fn(*args, **kw)

        return call

    async def container_stop(self, now=False):
        seen["container"] = "stopped"

    monkeypatch.setattr(waiting, "cancel", where("cancel", real_cancel))
    monkeypatch.setattr(gpu_spawner, "release", where("release", real_release))
    monkeypatch.setattr(DockerSpawner, "stop", container_stop)
    await sp.stop()
    assert seen == {"cancel": "gpulab-records", "release": "gpulab-records", "container": "stopped"}
    (rec,) = await off(UsageLedger(host.db_url).records)
    assert (rec.owner, rec.project) == ("alice", "train")
    assert holdings(host) == {}
