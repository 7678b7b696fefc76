"""The GPU wait queue: a start that finds no GPU waits here instead of being refused.

``next_grant`` decides, pure (no I/O, no clock): which queued requests get GPUs now,
in fair-share order: users under budget before users over it, then the least GPU
time over the recent window first, then first come first served. Fitting is the
allocator's own ``choose``. An entry that does not fit keeps the free devices it
could use for itself (so a two-GPU request is not starved by one-GPU requests
behind it); an entry that cannot be met on this host at all (``choose`` refuses it
with no holder in its way) waits without holding anyone else up.

``QueueStore`` keeps the entries in one JSON file under the same lock and atomic,
fsynced writes as the allocation record, so concurrent hub processes neither lose
an entry nor grant one twice, and a hub restart finds the queue as it was.
``QueueStore.grant`` takes the granted entries out of the queue and records their
GPUs in the allocation record under both locks (queue first, then allocations).

``reclaim_for`` says which idle holders the keeper may reclaim: only those whose
stops ``next_grant`` turns into grants (gpus/keeper.py).

``waiting_words`` is the sentence the spawn page shows a waiting user.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from gpulab_hub import jsonfile, stateversion
from gpulab_hub.gpus import Device
from gpulab_hub.gpus.allocator import (
    AllocationError,
    AllocationStore,
    Held,
    Holder,
    Policy,
    Request,
    choose,
)

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")  # owner and project, as recorded
KIND = re.compile(r"[A-Za-z0-9 ._+-]{0,64}")  # gpu_type and mig_profile, as recorded
MAX_ENTRIES = 10_000  # more waiting starts than any one box sees
MOST = 4  # holders ``waiting_words`` names; the rest are counted
RESERVED = "(queued)"  # owner of the placeholder a waiting entry keeps free devices with


class QueueError(Exception):
    """A queue operation that cannot be done; ``str()`` is the message for the user."""


@dataclass(frozen=True)
class Entry:
    request: Request  # owner, project and what it asked for
    enqueued_at: float  # epoch seconds: waiting since

    @property
    def owner(self) -> str:
        return self.request.owner

    @property
    def project(self) -> str:
        return self.request.project

    @property
    def key(self) -> tuple[str, str]:
        return (self.request.owner, self.request.project)


@dataclass(frozen=True)
class Grant:
    entry: Entry
    devices: tuple[Device, ...]


def order(
    entries: Sequence[Entry], usage: Mapping[str, float], over_budget: Collection[str] = ()
) -> list[Entry]:
    """``entries`` in fair-share order: under budget first, least GPU-hours, then FIFO.

    ``entries`` is in arrival order (the queue's own); equal times keep it.
    """
    ranked = sorted(
        enumerate(entries),
        key=lambda ie: (
            ie[1].owner in over_budget,
            usage.get(ie[1].owner, 0.0),
            ie[1].enqueued_at,
            ie[0],
        ),
    )
    return [e for _, e in ranked]


def next_grant(
    entries: Sequence[Entry],
    devices: list[Device],
    held: Held,
    policy: Policy,
    usage: Mapping[str, float],
    over_budget: Collection[str] = (),
) -> list[Grant]:
    """The entries that get devices now, with their devices, in the order they are served.

    ``usage``: GPU-hours per user over the fair-share window; ``over_budget``: users
    past their budget. Each grant is decided on the holdings the earlier ones leave.
    """
    held = dict(held)
    grants: list[Grant] = []
    for e in order(entries, usage, over_budget):
        try:
            got = choose(devices, held, e.request, policy)
        except AllocationError as refused:
            if refused.busy:  # it waits for holders: keep what it could use free for it
                for d in _could_use(devices, held, e.request, policy):
                    held[d.uuid] = held.get(d.uuid, ()) + (Holder(RESERVED, e.project, 0.0),)
            continue
        for d in got:
            mine = held.get(d.uuid, ())
            if all(h.key != e.key for h in mine):
                held[d.uuid] = mine + (Holder(e.owner, e.project, 0.0),)
        grants.append(Grant(e, tuple(got)))
    return grants


Key = tuple[str, str]


def without(held: Held, keys: Collection[Key]) -> Held:
    """``held`` as it is once the projects ``keys`` stopped (their holdings released)."""
    after = {u: tuple(h for h in hs if h.key not in keys) for u, hs in held.items()}
    return {u: hs for u, hs in after.items() if hs}


def reclaim_for(
    entries: Sequence[Entry],
    devices: list[Device],
    held: Held,
    policy: Policy,
    usage: Mapping[str, float],
    over_budget: Collection[str] = (),
    stopping: Collection[Key] = (),
) -> Callable[[Sequence[Key]], list[Key]]:
    """Which idle holders the queue can use: a function of the holders that may be
    reclaimed (the first to be reclaimed first) giving those whose stops let
    :func:`next_grant`, the grant itself, serve starts it cannot serve now.

    The first of them that serve the most starts, less those the grants do
    without: each one chosen frees a device a grant that follows takes, without any
    one of them fewer starts are granted, and they are no more than the devices
    granted for them (one holder per GPU granted). A holder that would free a GPU for
    nobody (the waiting user is at her limit, the start asks for more than the host
    has, another start is ahead and cannot use it, ...) is never chosen.
    ``stopping``: projects already stopping, whose devices count as free (a holder
    being reclaimed for a start counts toward it)."""
    base = without(held, stopping)

    def grants(stopped: Collection[Key]) -> list[Grant]:
        return next_grant(entries, devices, without(base, stopped), policy, usage, over_budget)

    def useless(chosen: list[Key]) -> Key | None:
        """The last of ``chosen`` whose devices no grant takes, or that the grants do
        without (fewer of them serve as many); the last of them if they are more than
        the devices granted for them; None: each is needed."""
        got = grants(chosen)
        taken = {d.uuid for g in got for d in g.devices}
        new = sum(len(g.devices) for g in got if g.entry.key not in anyway)
        if chosen and len(chosen) > new:
            return chosen[-1]  # a user's own projects stopped to bring her under her limit
        for c in reversed(chosen):
            if not {u for u, hs in base.items() if any(h.key == c for h in hs)} & taken:
                return c  # frees a GPU nobody is granted (its owner's limit, say)
        for c in reversed(chosen):
            if len(grants([k for k in chosen if k != c])) >= len(got):
                return c
        return None

    anyway = {g.entry.key for g in grants(())}  # granted without a reclaim

    def needed(candidates: Sequence[Key]) -> list[Key]:
        order = list(dict.fromkeys(candidates))
        counts = [len(grants(order[:k])) for k in range(len(order) + 1)]
        chosen = order[: counts.index(max(counts))]
        while (c := useless(chosen)) is not None:
            chosen.remove(c)
        return chosen

    return needed


def _could_use(devices: list[Device], held: Held, r: Request, policy: Policy) -> list[Device]:
    """The devices free now that would fit one unit of ``r`` (a GPU, or its MIG slice)."""
    one = replace(r, count=0 if r.mig_profile else 1)
    out = []
    for d in devices:
        try:
            out += choose([d], held, one, policy)
        except AllocationError:
            continue
    return out


@dataclass(frozen=True)
class Blocker:
    """A holder standing between a waiting start and a GPU, as the spawn page names it."""

    device: str  # "GPU 1", "MIG slice 0:1"
    owner: str
    project: str
    idle_min: float | None = None  # minutes idle; None: in use
    job: bool = False  # running a job (never reclaimed)


def blockers(
    busy: Sequence[tuple[Device, tuple[Holder, ...]]],
    idle_min: Mapping[tuple[str, str], float | None],
    jobs: Collection[tuple[str, str]] = (),
) -> list[Blocker]:
    """The holders in ``busy`` (an ``AllocationError``'s) as the spawn page names them.

    ``idle_min``: minutes each (owner, project) has been idle (missing or None: in
    use); ``jobs``: those running a job."""
    out = []
    for d, hs in busy:
        name = f"{'MIG slice' if d.parent_uuid else 'GPU'} {d.index}"
        for h in hs:
            out.append(Blocker(name, h.owner, h.project, idle_min.get(h.key), h.key in jobs))
    return out


def waiting_words(
    position: int, blockers: Sequence[Blocker] = (), owner: str = "", admin: bool = False
) -> str:
    """The spawn page's sentence for a start of ``owner``'s waiting at ``position`` (0:
    next in line). An admin is told who holds the GPUs, e.g. "waiting for a GPU: 2
    ahead; GPU 1 is held by bob/sweep (idle 35 min)"; anyone else is told of
    ``owner``'s own projects alike, never of another user's ("GPU 1 is in use by
    another project, idle 35 min": docs/security.md, only admins see others' GPU use)."""
    if position < 0:
        raise ValueError(f"a place in the queue is 0 or more, not {position}")
    place = "next in line" if position == 0 else f"{position} ahead"
    said = []
    for b in blockers[:MOST]:
        if b.job:
            state = "running a job"
        elif b.idle_min is None:
            state = "in use"
        else:
            state = f"idle {int(b.idle_min)} min"
        if admin or b.owner == owner:
            said.append(f"{b.device} is held by {b.owner}/{b.project} ({state})")
        else:
            said.append(f"{b.device} is in use by another project" + (
                "" if b.idle_min is None and not b.job else f", {state}"
            ))  # fmt: skip
    if len(blockers) > MOST:
        said.append(f"and {len(blockers) - MOST} more")
    return "; ".join([f"waiting for a GPU: {place}", *said])


class QueueStore(jsonfile.LockedRecord):
    """The waiting starts, in arrival order, in one JSON file; every change under a lock.

    One entry per project: enqueueing a project that waits already changes what it
    asks for and keeps its place.
    """

    kind = stateversion.KINDS["gpu-queue"]
    section = "queue"
    what = "The GPU queue"
    on_damage = (
        "the queue starts empty (the starts that waited must be started again; "
        "the moved file lists them)"
    )
    Error = QueueError
    max_bytes = 8 << 20

    def __init__(self, path: Path, clock: Callable[[], float] = time.time, log=None):
        super().__init__(path, log)
        self._clock = clock
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def _parse(self, section) -> list[Entry]:
        if not isinstance(section, list):
            raise TypeError('"queue" is not a list of entries')
        if len(section) > MAX_ENTRIES:
            raise ValueError(f"more than {MAX_ENTRIES} entries")
        entries = [_entry(e) for e in section]
        if len({e.key for e in entries}) != len(entries):
            raise ValueError("a project waits twice")
        return entries

    def _missing(self) -> list[Entry]:
        return []

    def _recover(self) -> list[Entry]:
        return []

    def _dump(self, entries: list[Entry]) -> list[dict]:
        return [{**asdict(e.request), "enqueued_at": e.enqueued_at} for e in entries]

    def entries(self) -> list[Entry]:
        """Every waiting start, in arrival order."""
        with self.locked():
            return self._read()

    def enqueue(self, request: Request) -> Entry:
        """Put ``request`` in the queue (or change what its waiting project asks for)."""
        _check(request)
        with self.locked():
            entries = self._read()
            for n, e in enumerate(entries):
                if e.key == (request.owner, request.project):
                    entries[n] = Entry(request, e.enqueued_at)
                    if entries[n] != e:
                        self._write(entries)
                    return entries[n]
            if len(entries) >= MAX_ENTRIES:
                raise QueueError(
                    f"{request.owner}/{request.project} cannot wait for a GPU: "
                    f"{MAX_ENTRIES} starts wait already. Try again later."
                )
            entry = Entry(request, self._clock())
            self._write([*entries, entry])
            return entry

    def cancel(self, owner: str, project: str) -> bool:
        """Take the project out of the queue; whether it was waiting."""
        with self.locked():
            entries = self._read()
            kept = [e for e in entries if e.key != (owner, project)]
            if len(kept) != len(entries):
                self._write(kept)
            return len(kept) != len(entries)

    def position(
        self,
        owner: str,
        project: str,
        usage: Mapping[str, float] | None = None,
        over_budget: Collection[str] = (),
    ) -> int | None:
        """How many waiting starts are ahead of the project's (None: it is not waiting)."""
        ranked = order(self.entries(), usage or {}, over_budget)
        for n, e in enumerate(ranked):
            if e.key == (owner, project):
                return n
        return None

    def next_grant(
        self,
        devices: list[Device],
        held: Held,
        policy: Policy,
        usage: Mapping[str, float],
        over_budget: Collection[str] = (),
    ) -> list[Grant]:
        """Take the entries that fit ``held`` now out of the queue; those grants.

        The caller records the devices (see :meth:`grant`, which does both at once).
        """
        with self.locked():
            entries = self._read()
            grants = next_grant(entries, devices, held, policy, usage, over_budget)
            if grants:
                gone = {g.entry.key for g in grants}
                self._write([e for e in entries if e.key not in gone])
            return grants

    def grant(
        self,
        allocations: AllocationStore,
        devices: list[Device],
        policy: Policy,
        usage: Mapping[str, float],
        over_budget: Collection[str] = (),
    ) -> list[Grant]:
        """Serve the queue: each granted start leaves it with its devices recorded as held.

        Decided and written under the queue's lock, then the allocation record's, so
        two hubs serving the queue at once never hand out one entry or device twice.
        """
        with self.locked(), allocations.locked():
            entries = self._read()
            grants = next_grant(
                entries, devices, allocations.holdings(), policy, usage, over_budget
            )
            done = []
            for g in grants:
                # only the devices decided on: a device kept free for an entry that
                # waits must not be taken by this one
                try:
                    got = allocations.allocate(list(g.devices), g.entry.request, policy)
                except AllocationError as e:  # the record changed under another lock holder
                    self.log.warning("GPU queue: %s keeps waiting: %s", g.entry.key, e)
                    continue
                done.append(Grant(g.entry, tuple(got)))
            if done:
                gone = {g.entry.key for g in done}
                self._write([e for e in entries if e.key not in gone])
            return done


def _check(r: Request) -> None:
    names = (r.owner, r.project)
    if not all(isinstance(n, str) and NAME.fullmatch(n) for n in names):
        raise QueueError(f"not a user and project name gpulab queues: {r.owner!r}/{r.project!r}")
    if not all(isinstance(k, str) and KIND.fullmatch(k) for k in (r.gpu_type, r.mig_profile)):
        raise QueueError(f"not a GPU kind gpulab queues: {r.gpu_type!r} {r.mig_profile!r}")
    if not isinstance(r.count, int) or isinstance(r.count, bool) or not 0 <= r.count <= 64:
        raise QueueError(f"{r.owner}/{r.project}: not a number of GPUs: {r.count!r}")


def _entry(e) -> Entry:
    if not isinstance(e, dict):
        raise TypeError(f"an entry is a {type(e).__name__}, not an object")
    t = e["enqueued_at"]
    if not isinstance(t, int | float) or isinstance(t, bool):
        raise TypeError(f"an entry's time is not a number: {t!r}")
    r = Request(e["owner"], e["project"], e["count"], e["gpu_type"], e["mig_profile"])
    try:
        _check(r)
    except QueueError as bad:
        raise ValueError(str(bad)) from bad
    return Entry(r, float(t))
