"""The hub's build pool: image builds run on threads of their own, a few per user.

Starts, stops, polls and deletes run on the spawner's Docker pool; a build can
take an hour, so builds never run there (8 slow builds once made another user's
start of an unchanged project wait 69 s). A build waits for a slot of its user
(``build_max_per_user``) and then for one of the hub's (``build_threads``); the
spawn page says which it waits for, and whose build (the user's own projects) holds
the user's slots. A slot is given back when the build's thread ends, not when its
start is cancelled, so a cancelled start never lets a user run more builds than their
share.

A small rebuild never waits behind a big one: where the user's slots are taken, one
build of theirs at a time runs at once in the quick lane, for ``quick_s`` seconds at
most (BuildLimits.quick_s: the build's running step is killed past it). A rebuild
that takes all but its last steps from Docker's cache (after %gpu_install appended a
line) ends in seconds. What the user's Dockerfile claims decides nothing: a build
that runs past the time is stopped (images.QuickBuildOver, not recorded as a failed
build) and waits for the user's slot like any other, then goes on from the steps it
finished (Docker's cache).

The bound is by cost: a quick build is part of its user's share, never of the other
users'. It starts only while one of the hub's slots is free, so it never queues
before another user's build; and where another user's build finds every hub slot
taken, a quick build gives its slot up at once (its step is stopped as past its time,
BuildLimits.quick_stop) and waits for its user's slot. So a user holds at most
``build_max_per_user`` slots plus one quick build for ``quick_s`` at a time, and that
quick build never makes another user's build wait.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future

from gpulab_hub import blocking
from gpulab_hub.images import QuickBuildOver

_pool: BuildPool | None = None
_pool_lock = threading.Lock()

# build(quick) -> the image's tag (blocking, a build thread); ``quick``: None in a slot,
# in the quick lane the event the pool sets when the build must give its slot up
Build = Callable[[threading.Event | None], str]


class BuildPool:
    def __init__(self, threads: int, per_user: int, quick_s: float = 0):
        self.threads, self.per_user = max(1, threads), max(1, per_user)
        self.quick_s = max(0.0, quick_s)
        blocking.configure(blocking.BUILDS, self.threads)
        self.executor = blocking.pool(blocking.BUILDS)
        self.slots = asyncio.Semaphore(self.threads)
        self.users: dict[str, asyncio.Semaphore] = {}
        self.holders: dict[str, list[str]] = {}  # user -> projects whose builds hold a slot
        self.quick: set[str] = set()  # users with a build in the quick lane now
        # the quick builds on a build thread now, each with the event that stops it
        self.quick_running: dict[str, threading.Event] = {}
        self.running = 0
        self.asked = 0  # users' builds asked for and not yet ended (waiting or running)

    async def run(self, user: str, project: str, emit: Callable[[int, str], None], build: Build):
        """``build`` on a build thread once ``user`` and the hub have a slot, or at once in
        the quick lane while the user's slots are taken (``project``: the start's project,
        as its owner knows it, for their other starts' spawn pages)."""
        self.asked += 1
        try:
            mine = self.users.setdefault(user, asyncio.Semaphore(self.per_user))
            why = ""
            # a quick build only where a hub slot is free: it never queues before another's
            lane = self.quick_s and user not in self.quick and not self.slots.locked()
            if mine.locked() and lane:
                stop = threading.Event()
                try:
                    return await self._quick(user, emit, build, stop)
                except QuickBuildOver:
                    if stop.is_set():
                        why = "this build gave its place beside it to another user's build"
                    else:
                        why = f"this build ran past {self.quick_s:.0f} s beside it, more than a"
                        why += " quick rebuild"
            return await self._run(user, project, mine, emit, build, why)
        finally:
            self.asked -= 1

    def _others(self, user: str) -> str:
        """' (project B)': the user's projects whose builds hold their slots now."""
        names = [f"project {n}" for n in self.holders.get(user) or []]
        if not names:
            return ""
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        return f" ({', '.join(names[:3])}{more})"

    def _waiting(self, user: str, why: str = "") -> str:
        return (
            f"Waiting for your other image build{self._others(user)} to finish"
            + (f": {why}; it then goes on from the steps it finished" if why else "")
            + f" (you may run {self.per_user} at a time on this hub)."
            " Stop starting to give up the wait."
        )

    async def _quick(self, user: str, emit, build: Build, stop: threading.Event):
        self.quick.add(user)
        emit(
            9,
            f"Your other image build{self._others(user)} is running: this rebuild runs "
            f"beside it for up to {self.quick_s:.0f} s (a rebuild that reuses its cached "
            "steps needs seconds)",
        )

        # the lane is the user's again when the build's thread ended (not a cancelled start)
        def give_back() -> None:
            self.quick_running.pop(user, None)
            self.quick.discard(user)

        self.quick_running[user] = stop
        return await self._on_thread(emit, build, stop, give_back)

    async def _run(self, user: str, project: str, mine, emit, build: Build, why: str = ""):
        if mine.locked() or why:
            emit(9, self._waiting(user, why))
        await mine.acquire()
        holders = self.holders.setdefault(user, [])
        holders.append(project)

        def give_back() -> None:
            holders.remove(project)
            mine.release()

        return await self._on_thread(emit, build, None, give_back)

    def _make_room(self) -> None:
        """A build in a user's slot finds the hub's slots taken: one quick build that
        holds one (another user's, as the user's own waits in their slot) gives it up."""
        for stop in self.quick_running.values():
            if not stop.is_set():
                stop.set()
                return

    async def _on_thread(
        self, emit, build: Build, quick: threading.Event | None, give_back: Callable[[], None]
    ):
        """``build(quick)`` on a build thread once the hub has a slot; ``give_back`` (the
        user's slot or lane) is called with the hub's slot's release, when the thread ends."""
        try:
            if self.slots.locked():
                self._make_room()
                emit(9, f"Waiting for a build slot: {self.threads} builds are running on this hub")
            await self.slots.acquire()
        except BaseException:
            give_back()
            raise
        loop = asyncio.get_running_loop()

        def done(_: Future) -> None:
            loop.call_soon_threadsafe(self._release, give_back)

        self.running += 1
        try:
            future = self.executor.submit(build, quick)
        except BaseException:
            self._release(give_back)
            raise
        future.add_done_callback(done)
        return await asyncio.wrap_future(future)

    def _release(self, give_back: Callable[[], None]) -> None:
        self.running -= 1
        self.slots.release()
        give_back()


def pool(threads: int, per_user: int, quick_s: float = 0) -> BuildPool:
    """The hub's one build pool (made on first use, with the settings of that use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = BuildPool(threads, per_user, quick_s)
        return _pool


def busy() -> bool:
    """Whether a user's build runs or waits for a slot now (the background builds of
    the starting points, images/prebuild.py, start none while one does)."""
    return _pool is not None and _pool.asked > 0
