"""The hub's build pool: image builds run on threads of their own, a few per user.

Starts, stops, polls and deletes run on the spawner's Docker pool; a build can
take an hour, so builds never run there (8 slow builds once made another user's
start of an unchanged project wait 69 s). A build waits for a slot of its user
(``build_max_per_user``) and then for one of the hub's (``build_threads``); the
spawn page says which it waits for. A slot is given back when the build's thread
ends, not when its start is cancelled, so a cancelled start never lets a user
run more builds than their share.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future

from gpulab_hub import blocking

_pool: BuildPool | None = None
_pool_lock = threading.Lock()


class BuildPool:
    def __init__(self, threads: int, per_user: int):
        self.threads, self.per_user = max(1, threads), max(1, per_user)
        blocking.configure(blocking.BUILDS, self.threads)
        self.executor = blocking.pool(blocking.BUILDS)
        self.slots = asyncio.Semaphore(self.threads)
        self.users: dict[str, asyncio.Semaphore] = {}
        self.running = 0

    async def run(self, user: str, emit: Callable[[int, str], None], fn, *args):
        """``fn(*args)`` on a build thread once ``user`` and the hub have a slot."""
        mine = self.users.setdefault(user, asyncio.Semaphore(self.per_user))
        if mine.locked():
            emit(
                9,
                f"Waiting for your other image build to finish (you may run {self.per_user} "
                "at a time on this hub)",
            )
        await mine.acquire()
        try:
            if self.slots.locked():
                emit(9, f"Waiting for a build slot: {self.threads} builds are running on this hub")
            await self.slots.acquire()
        except BaseException:
            mine.release()
            raise
        loop = asyncio.get_running_loop()

        def done(_: Future) -> None:
            loop.call_soon_threadsafe(self._release, user, mine)

        self.running += 1
        try:
            future = self.executor.submit(fn, *args)
        except BaseException:
            self._release(user, mine)
            raise
        future.add_done_callback(done)
        return await asyncio.wrap_future(future)

    def _release(self, user: str, mine: asyncio.Semaphore) -> None:
        self.running -= 1
        self.slots.release()
        mine.release()


def pool(threads: int, per_user: int) -> BuildPool:
    """The hub's one build pool (made on first use, with the settings of that use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = BuildPool(threads, per_user)
        return _pool
