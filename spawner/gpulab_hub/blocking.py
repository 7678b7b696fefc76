"""One rule for blocking work: it never runs on the event-loop thread.

The hub (Tornado on asyncio) and the SSH gateway (asyncio) each run one event loop;
a page that waits on a file lock, an fsync or the Docker engine there stops every
other user's pages. Blocking work goes to one of three named, bounded pools:

- ``DOCKER``: calls to the Docker engine (starts, stops, polls, deletes, lists);
- ``BUILDS``: image builds (an hour at most each; never on the Docker pool, so a slow
  build never makes another user's start wait);
- ``RECORDS``: the hub's small records on disk (locks, reads, atomic writes, fsync);
- ``PUBLIC``: file work of anonymous public-link views (sharing/publicrender.py), apart
  from the pools signed-in users need, so a crowd of visitors never slows them.

``await run(RECORDS, fn, *args, **kwargs)`` runs ``fn`` on a pool's thread.
:func:`file_lock` is the one file lock (:func:`fd_lock` the same lock through a
descriptor, awaited, for files in folders users own): it times out with :class:`Busy`, whose
words a page shows as they are (503). Store locks and the Docker client call
:func:`off_loop`, the guard: with ``GPULAB_LOOP_GUARD=strict`` (tests, and the hubs
tests start) blocking on the loop's thread raises :class:`OnLoop`; otherwise it logs
one warning for each kind of work.

Nothing is made at import time: a pool starts its threads on first use.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import fcntl
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tornado.web import HTTPError

LOG = logging.getLogger("gpulab_hub")

DOCKER = "docker"
BUILDS = "builds"
RECORDS = "records"
PUBLIC = "public"

# Threads per pool, unless the hub's traits set them first (configure()):
# - docker: ProjectSpawner.docker_threads' default; each call holds a connection to the
#   engine, and the engine serialises much of its own work, so more threads only queue there;
# - builds: ProjectSpawner.build_threads' default; a build uses CPUs and disk for minutes;
# - records: record work takes milliseconds; a few threads keep one slow disk or one held
#   lock (up to LOCK_TIMEOUT) from stalling every page, and bound the open files;
# - public: what anonymous visitors may occupy at once (opening a notebook, finding a link).
SIZES = {DOCKER: 8, BUILDS: 4, RECORDS: 4, PUBLIC: 2}

# How long a store lock may be waited for. A store holds its lock for one read and one
# atomic write (milliseconds); waiting longer means another process is stuck, and the
# user is better told so than left looking at a page that never loads.
LOCK_TIMEOUT = 10.0

GUARD_ENV = "GPULAB_LOOP_GUARD"

_pools: dict[str, ThreadPoolExecutor] = {}
_sizes: dict[str, int] = {}
_lock = threading.Lock()
_warned: set[str] = set()


class Busy(HTTPError):
    """A lock that was not free in time; ``str()`` is a sentence for the user. An
    HTTPError (503, those words), so a hub page that lets it through shows the words,
    never a traceback."""

    def __init__(self, what: str):
        self.what = what
        self.sentence = (
            f"{what[:1].upper()}{what[1:]} is busy: another change to {what} is under way; "
            "try again in a moment."
        )
        super().__init__(503, "%s", self.sentence)

    def __str__(self) -> str:
        return self.sentence


class OnLoop(RuntimeError):
    """Blocking work was started on the thread that runs an event loop (strict guard)."""


def configure(name: str, threads: int) -> None:
    """Set a pool's size from the hub's settings; only before its first use (later
    calls with another size are logged and change nothing)."""
    if name not in SIZES:
        raise KeyError(f"no pool named {name!r}; gpulab's pools are {', '.join(SIZES)}")
    threads = max(1, int(threads))
    with _lock:
        made = _pools.get(name)
        if made is None:
            _sizes[name] = threads
        elif made._max_workers != threads:
            LOG.warning(
                "The %s pool already runs %d threads; a new size (%d) takes effect when the "
                "hub restarts.", name, made._max_workers, threads,
            )  # fmt: skip


def pool(name: str) -> ThreadPoolExecutor:
    """The pool named ``name`` (DOCKER, BUILDS, RECORDS or PUBLIC), made on first use; its
    threads are named ``gpulab-<name>_<n>``."""
    if name not in SIZES:
        raise KeyError(f"no pool named {name!r}; gpulab's pools are {', '.join(SIZES)}")
    made = _pools.get(name)
    if made is not None:
        return made
    with _lock:
        made = _pools.get(name)
        if made is None:
            size = _sizes.get(name, SIZES[name])
            made = _pools[name] = ThreadPoolExecutor(size, thread_name_prefix=f"gpulab-{name}")
        return made


async def run(name: str, fn, /, *args, **kwargs):
    """``fn(*args, **kwargs)`` on a thread of the pool ``name``; its result (or error).
    Context variables travel with it, as with :func:`asyncio.to_thread`."""
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return await loop.run_in_executor(pool(name), call)


def on_loop_thread() -> bool:
    """Whether this code runs on an event loop now (a loop runs on this thread, in this
    greenlet: Playwright's sync API, in tests, runs its loop in another greenlet of the
    test's thread, and the test's own code is not on that loop)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False
    if "greenlet" not in sys.modules:
        return True
    frame = sys._getframe(1)
    while frame is not None:  # the loop's own frame is on this stack when we run on it
        if frame.f_code.co_name == "_run_once" and frame.f_locals.get("self") is loop:
            return True
        frame = frame.f_back
    return False


def strict() -> bool:
    return os.environ.get(GUARD_ENV, "").strip().lower() == "strict"


_allowed: contextvars.ContextVar[str] = contextvars.ContextVar("gpulab_allowed", default="")


@contextlib.contextmanager
def allowed(why: str) -> Iterator[None]:
    """Blocking work the guard lets through on the loop, each use with its reason
    (``why``): the hub's configuration, read before it serves anyone; a hook JupyterHub
    calls synchronously, whose record must be written before JupyterHub goes on."""
    token = _allowed.set(why)
    try:
        yield
    finally:
        _allowed.reset(token)


def off_loop(what: str) -> None:
    """The guard: call it before blocking work (``what`` names it). On the event-loop
    thread it raises :class:`OnLoop` when ``GPULAB_LOOP_GUARD=strict``, else logs one
    warning per ``what``; off the loop (or within :func:`allowed`) it does nothing."""
    if not on_loop_thread() or _allowed.get():
        return
    message = (
        f"{what} ran on the event-loop thread, where it stops every other page while it "
        "waits; run it with gpulab_hub.blocking.run()"
    )
    if strict():
        raise OnLoop(message)
    if what not in _warned:
        _warned.add(what)
        LOG.warning("%s.", message)


class file_lock:  # noqa: N801 - used like the function it replaces: `with file_lock(...)`
    """A :class:`filelock.FileLock` on ``path`` that gives up after ``timeout`` seconds
    with :class:`Busy` naming ``what`` (a singular noun phrase: "the sharing record").
    Re-entrant within a thread; one object may be
    kept and entered many times. Entering it is blocking work (:func:`off_loop`)."""

    def __init__(self, path: str | Path, what: str, timeout: float = LOCK_TIMEOUT):
        from filelock import FileLock

        self.path, self.what, self.timeout = Path(path), what, timeout
        self._lock = FileLock(str(path), timeout=timeout)

    @property
    def is_locked(self) -> bool:
        return self._lock.is_locked

    def acquire(self) -> None:
        from filelock import Timeout

        off_loop(f"Taking the lock of {self.what}")
        try:
            self._lock.acquire()
        except Timeout:
            raise Busy(self.what) from None

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> file_lock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


# How often fd_lock tries a held lock again (filelock's own default interval).
POLL_S = 0.05


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


async def fd_lock(fd: int, what: str, timeout: float = LOCK_TIMEOUT) -> None:
    """Take :class:`file_lock`'s lock through the open descriptor ``fd``, for the hub's
    pages: ``flock(LOCK_EX)``, the lock filelock takes on Unix, so a process holding a
    FileLock on the same file and this one exclude each other; :class:`Busy` (naming
    ``what``) after ``timeout`` seconds. Held until ``fd`` is closed.

    For a file in a folder a user owns, which a user can hold as long as they like:
    the wait holds no thread (each try is one non-blocking call on the records pool),
    so a user holding their own lock never stalls anyone else's record work; and the
    caller opens the file without following links (filelock takes a path and resolves
    it by name, its folder's real path first, which follows any link the user swaps
    into the folder meanwhile)."""
    deadline = time.monotonic() + timeout
    while not await run(RECORDS, _try_flock, fd):
        if time.monotonic() >= deadline:
            raise Busy(what)
        await asyncio.sleep(POLL_S)


def shutdown() -> None:
    """Stop every pool's threads (queued work is cancelled); tests and a hub's stop."""
    with _lock:
        pools = list(_pools.values())
        _pools.clear()
    for made in pools:
        made.shutdown(wait=False, cancel_futures=True)
