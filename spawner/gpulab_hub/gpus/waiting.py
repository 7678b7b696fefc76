"""A start that finds no GPU free waits in the GPU queue (queue.py) instead of failing.

``wait`` is the spawner's side: it puts the start's request in the queue, then every
``TICK`` seconds looks for its own entry: granted (its devices are in the allocation
record), still waiting (the spawn page gets the waiting words whenever they
change), or gone (cancelled). The queue itself is served (dead holders released
first, then ``QueueStore.grant`` in fair-share order with the usage ledger's hours
and the budgets) once a tick for the whole hub, not once for each waiting start
(:func:`tick`): the waiting starts of one hub share that serve, so twenty waiters
cost one listing of the project containers and one fair-share query a second, plus
a look each at its own entry. Whichever tick grants an entry, the entry's own start
notices it within a tick, so a released GPU goes to the next in line within about a
second.

Where the work runs: the listing of project containers (``Liveness``) on the Docker
pool; the queue, the allocation record and the usage ledger (the hub's database) on
the records pool (``blocking.RECORDS``), so waiting starts never hold the Docker pool
that everyone's polls, stops and starts need.

A start that is cancelled (the project stopped while it waits), fails or gives up
leaves the queue, and gives back devices it was granted but did not use.
"""

from __future__ import annotations

import asyncio
import math
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpulab_hub import blocking, gpus
from gpulab_hub.gpus import allocator, queue, usage
from gpulab_hub.gpus import spawner as gpu_spawner

TICK = 1.0  # seconds between looks at the queue
GROUP = "group:"  # gpu_budget_hours keys naming a JupyterHub group
EVERYONE = "*"  # gpu_budget_hours key for users without a budget of their own


class QueueCancelled(allocator.AllocationError):
    """The start left the queue without a GPU (its project was stopped)."""


def s_log(s):
    return gpu_spawner._log(s)


def queue_of(s: gpu_spawner.GpuTraits) -> queue.QueueStore:
    return queue.QueueStore(Path(s.queue_file), clock=lambda: gpu_spawner.clock(), log=s_log(s))


def budgets_of(s: gpu_spawner.GpuTraits, members: Mapping[str, list[str]]) -> usage.Budgets:
    """The ``gpu_budget_hours`` setting as ``Budgets``; ``members``: each group's users."""
    b = dict(s.gpu_budget_hours)
    return usage.Budgets(
        users={k: v for k, v in b.items() if not k.startswith(GROUP) and k != EVERYONE},
        groups={k[len(GROUP) :]: v for k, v in b.items() if k.startswith(GROUP)},
        members=dict(members),
        default=b.get(EVERYONE),
    )


def budget_groups(s: gpu_spawner.GpuTraits) -> list[str]:
    """The JupyterHub groups the budgets name (their members are looked up by the hub)."""
    return sorted(k[len(GROUP) :] for k in s.gpu_budget_hours if k.startswith(GROUP))


@dataclass
class Look:
    """What one tick saw of this start's entry."""

    devices: list[gpus.Device] | None = None  # granted: its devices
    words: str = ""  # waiting: the spawn page's sentence
    gone: bool = False  # neither waiting nor granted


def _fair_share(s, allocations, members) -> tuple[dict[str, float], frozenset[str]]:
    hours = gpu_spawner.ledger_of(s).hours_by_user(s.gpu_usage_window, held=allocations.holdings())
    return hours, budgets_of(s, members).over(hours)


def _alive(allocations: allocator.AllocationStore, live: gpu_spawner.Liveness):
    """Liveness as ``reserve`` judges it: a spawn of this hub under way, a project
    container that exists (``live``, listed before the locks), or a holding reserved
    within RESERVE_GRACE (its container may not exist yet; another start may have just
    been granted it)."""
    now = gpu_spawner.clock()
    fresh = {
        h.key
        for hs in allocations.holdings().values()
        for h in hs
        if now - h.reserved < gpu_spawner.RESERVE_GRACE
    }
    return lambda o, p: (o, p) in fresh or live(o, p)


def serve(
    s, docker_call, prefix: str, members: Mapping[str, list[str]], live=None
) -> list[queue.Grant]:
    """Blocking: release dead holders, then grant what the queue's order allows now.
    ``live``: a ``gpu_spawner.Liveness`` listed before (else listed here: Docker)."""
    inv = gpu_spawner.cached_inventory()
    allocations = gpu_spawner.store_of(s, docker_call, prefix)
    q = queue_of(s)
    if live is None:
        live = gpu_spawner.Liveness(docker_call, prefix)  # never asked with the locks held
    with q.locked(), allocations.locked():
        dead = allocations.release_dead(_alive(allocations, live))
        for key in dead:
            s_log(s).info("GPU queue: %s/%s holds GPUs without a container: released", *key)
        hours, over = _fair_share(s, allocations, members)
        return q.grant(allocations, inv.devices, gpu_spawner.policy_of(s), hours, over)


def look(
    s,
    docker_call,
    prefix: str,
    request: allocator.Request,
    members,
    idle_min: Mapping[tuple[str, str], float] | None = None,
    admin: bool = False,
) -> Look:
    """Blocking: serve the queue, then what became of ``request``'s entry (:func:`see`)."""
    serve(s, docker_call, prefix, members)
    return see(s, docker_call, prefix, request, members, idle_min, admin)


def see(
    s,
    docker_call,
    prefix: str,
    request: allocator.Request,
    members,
    idle_min: Mapping[tuple[str, str], float] | None = None,
    admin: bool = False,
) -> Look:
    """Blocking (records only): what became of ``request``'s entry, the queue as the
    last serve left it. ``idle_min``: minutes each idle holder's server has reported no
    activity; ``admin``: whether the words may name other users' projects (the owner is
    an admin)."""
    key = (request.owner, request.project)
    inv = gpu_spawner.cached_inventory()
    allocations = gpu_spawner.store_of(s, docker_call, prefix)
    q = queue_of(s)
    with q.locked(), allocations.locked():
        held = allocations.holdings()
        hours, over = _fair_share(s, allocations, members)
        place = q.position(*key, usage=hours, over_budget=over)
        if place is None:
            mine = set(allocations.held_by(*key))
            if not mine:
                return Look(gone=True)
            with gpu_spawner._pending_lock:  # under way from here, as after reserve
                gpu_spawner._pending[key] = tuple(sorted(mine))
            return Look(devices=[d for d in inv.devices if d.uuid in mine])
    try:
        allocator.choose(inv.devices, held, request, gpu_spawner.policy_of(s))
        busy = ()  # it would fit: others are ahead of it
    except allocator.AllocationError as e:
        busy = e.busy
    said = queue.blockers(busy, idle_min or {})
    return Look(words=queue.waiting_words(place, said, request.owner, admin))


# The serve of each queue file under way or last made, by event loop (a hub runs one).
_serves: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Serves:
    def __init__(self):
        self.last: dict[str, float] = {}  # queue file -> monotonic time of its last serve
        self.running: dict[str, asyncio.Future] = {}


async def tick(s, docker_call, prefix: str, members: Mapping[str, list[str]], run) -> None:
    """Serve the queue at most once a ``TICK`` for all the waiting starts of this hub:
    a start whose tick finds a serve under way waits for that one; one that finds the
    last serve younger than a tick leaves it at that. The containers are listed with
    ``run`` (the Docker pool); the records are served on the records pool."""
    loop = asyncio.get_running_loop()
    mine = _serves.get(loop)
    if mine is None:
        mine = _serves[loop] = _Serves()
    key = str(s.queue_file)
    running = mine.running.get(key)
    if running is not None and not running.done():
        await asyncio.shield(running)
        return
    if time.monotonic() - mine.last.get(key, -math.inf) < TICK:
        return
    mine.last[key] = time.monotonic()

    async def once():
        live = await run(gpu_spawner.Liveness, docker_call, prefix)
        await blocking.run(blocking.RECORDS, serve, s, docker_call, prefix, members, live)

    running = mine.running[key] = asyncio.ensure_future(once())
    await asyncio.shield(running)


def enqueue(s, docker_call, prefix: str, request: allocator.Request) -> None:
    """Blocking: put ``request`` in the queue. What its project still holds from an
    earlier run (it is starting, so nothing runs it) is released first."""
    gpu_spawner.release(s, request.owner, request.project, docker_call, prefix)
    queue_of(s).enqueue(request)


def leave(s, docker_call, prefix: str, owner: str, project: str) -> None:
    """Blocking: the start ends without running: out of the queue, and what it was
    granted (if anything) given back."""
    try:
        queue_of(s).cancel(owner, project)
    except (queue.QueueError, OSError, blocking.Busy) as e:
        s_log(s).error("GPU queue: %s/%s not taken out of the queue: %s", owner, project, e)
    gpu_spawner.release(s, owner, project, docker_call, prefix)


def cancel(s, owner: str, project: str) -> bool:
    """Blocking: take (owner, project) out of the queue (its project stopped); never raises."""
    if not Path(s.queue_file).exists():  # nobody ever waited: nothing to make
        return False
    try:
        return queue_of(s).cancel(owner, project)
    except (queue.QueueError, OSError, blocking.Busy) as e:
        s_log(s).error("GPU queue: %s/%s not taken out of the queue: %s", owner, project, e)
        return False


async def wait(
    s,
    docker_call,
    prefix: str,
    request: allocator.Request,
    run: Callable[..., Awaitable],
    emit: Callable[[int, str], None],
    members: Mapping[str, list[str]] | None = None,
    idle_of: Callable[[], Mapping[tuple[str, str], float]] | None = None,
    admin: bool = False,
) -> tuple[list[gpus.Device], object]:
    """Wait in the queue until ``request`` is granted -> (devices, GpuAssignment).

    ``run(fn, *args)`` runs a call to Docker off the event loop (the Docker pool; record
    work goes to the records pool); ``emit(progress,
    message)`` tells the spawn page; ``idle_of()`` (on the event loop: the hub's
    database) the idle minutes of holders, for the words, which name other users'
    projects only to an admin (``admin``: the owner is one). Raises AllocationError
    when the wait is given up (``gpu_queue_max_wait``) or its entry leaves the queue
    without a GPU.
    """
    members = dict(members or {})
    key = (request.owner, request.project)
    await blocking.run(blocking.RECORDS, enqueue, s, docker_call, prefix, request)
    started = time.monotonic()
    said = ""
    done = False
    try:
        while True:
            idle = idle_of() if idle_of else {}
            await tick(s, docker_call, prefix, members, run)
            seen = await blocking.run(
                blocking.RECORDS, see, s, docker_call, prefix, request, members, idle, admin
            )
            if seen.devices is not None:
                emit(74, "A GPU is free: starting")
                assignment = await run(gpu_spawner.assign, s, docker_call, key, seen.devices)
                done = True
                return seen.devices, assignment
            if seen.gone:
                raise QueueCancelled(
                    f"{request.owner}/{request.project} left the GPU queue without a GPU "
                    "(it was cancelled). Start it again to wait for one."
                )
            if seen.words != said:
                said = seen.words
                emit(72, said)
            if time.monotonic() - started > s.gpu_queue_max_wait:
                hours = s.gpu_queue_max_wait / 3600
                raise allocator.AllocationError(
                    f"{request.owner}/{request.project} waited {hours:g} h for a GPU, "
                    f"the longest a start waits here, and gave up ({said}). "
                    "Start it again to wait again, or start it with 0 GPUs."
                )
            await asyncio.sleep(TICK)
    finally:
        if not done:
            # shielded: a cancelled start still leaves the queue and frees its grant
            await asyncio.shield(
                blocking.run(blocking.RECORDS, leave, s, docker_call, prefix, *key)
            )
