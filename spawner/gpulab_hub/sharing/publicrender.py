"""Rendering public notebooks, bounded: once per notebook version, off the hub's pools.

A public link's page (public.py) is open to anyone, so what one view may cost is
capped by the admin's settings (:class:`GpulabPublicLinks`):

- **once per version**: the HTML is cached under the file's identity and version
  (device, inode, size, mtime_ns and ctime_ns of the descriptor that was read; ctime
  cannot be set by the owner, so any write makes a new version), in a cache bounded
  in bytes and entries (least recently used out first). A failed render (too slow,
  not a notebook) is cached too, so it is not tried again on every view.
- **one render per version at a time**: views of a version being rendered wait for
  that render (coalesced), they never start another.
- **size**: a notebook over ``max_notebook_mib`` is not read or rendered at all.
- **time and memory**: each render is a fresh process (``nbrender.py``) with an
  address-space and CPU limit, killed (its whole process group) when
  ``render_timeout_s`` passes. A thread cannot be stopped; a process can.
- **off the pools signed-in users need**: files are opened on the hub's small pool for
  public views (blocking.PUBLIC) and renders run in child processes, at most ``render_workers``
  at once; never on JupyterHub's default executor (the home page's) or the
  spawner's Docker pool. At most ``render_queue`` versions wait for a render; past
  that a view is told the hub is busy (503).

The per-address rate limit lives in publiclimits.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from traitlets import Float, Integer
from traitlets.config import Configurable

from gpulab_hub import blocking
from gpulab_hub.projects import safefs
from gpulab_hub.sharing import nbrender
from gpulab_hub.sharing.notebooks import FileRefused, check_path, open_project_dir

CHILD = Path(nbrender.__file__)
STDERR_KEPT = 2000  # characters of a failed render's stderr put in the hub's log


class GpulabPublicLinks(Configurable):
    """Limits on what an anonymous view of a public notebook link may cost the hub."""

    max_notebook_mib = Float(
        10.0,
        min=0.01,
        max=50.0,
        config=True,
        help="""The largest notebook a public link shows, in MiB. A bigger one is not
        read or rendered; its page says how big it is and asks the visitor to have the
        owner share the project instead. At most 50 (the most Save a copy reads).
        Default: 10. Example: ``c.GpulabPublicLinks.max_notebook_mib = 20``""",
    )
    render_timeout_s = Float(
        30.0,
        min=1.0,
        max=600.0,
        config=True,
        help="""Seconds one render of a notebook may take (its own process, started
        fresh: about 2 s of it go to starting nbconvert). A render that takes longer is
        killed and the page says the notebook takes too long to show; that version of
        the notebook is not tried again until it changes or the hub restarts.
        Default: 30. Example: ``c.GpulabPublicLinks.render_timeout_s = 60``""",
    )
    render_memory_mib = Integer(
        2048,
        min=256,
        config=True,
        help="""Address space (MiB) of one render process; past it the render fails
        and the page says the notebook cannot be shown.
        Default: 2048. Example: ``c.GpulabPublicLinks.render_memory_mib = 4096``""",
    )
    render_workers = Integer(
        2,
        min=1,
        max=64,
        config=True,
        help="""Renders that run at once (each a process using up to one CPU core).
        Views of the same notebook version share one render.
        Default: 2. Example: ``c.GpulabPublicLinks.render_workers = 1``""",
    )
    render_queue = Integer(
        16,
        min=1,
        config=True,
        help="""Notebook versions that may wait for a render (running ones included).
        Past that, a view of yet another version is answered 503 "busy" with
        Retry-After; cached pages are still served.
        Default: 16. Example: ``c.GpulabPublicLinks.render_queue = 32``""",
    )
    cache_mib = Integer(
        256,
        min=0,
        config=True,
        help="""Memory (MiB) for rendered public notebooks, least recently viewed
        dropped first. A page larger than a quarter of it is served but not kept.
        0: nothing kept (every view renders, each render still bounded).
        Default: 256. Example: ``c.GpulabPublicLinks.cache_mib = 1024``""",
    )
    cache_entries = Integer(
        500,
        min=1,
        config=True,
        help="""Rendered notebook versions kept at most (see cache_mib).
        Default: 500. Example: ``c.GpulabPublicLinks.cache_entries = 2000``""",
    )
    views_per_minute = Integer(
        30,
        min=0,
        config=True,
        help="""Public notebook views each client address may make per minute (a
        burst of this many, then one every 60/N s); more are answered 429 with
        Retry-After. 0: no limit. The address is the one JupyterHub's proxy saw
        (X-Forwarded-For as configurable-http-proxy sets it, skipping only
        ``JupyterHub.trusted_downstream_ips``; X-Real-Ip is ignored). IPv6 clients
        count per /64 network. Default: 30.
        Example: ``c.GpulabPublicLinks.views_per_minute = 60``""",
    )

    @property
    def max_bytes(self) -> int:
        return int(self.max_notebook_mib * 2**20)

    @property
    def max_html_bytes(self) -> int:
        """The most HTML a render may give: outputs are embedded once, plus markup."""
        return 4 * self.max_bytes + 2**20


# ---- what a render gives -------------------------------------------------------------


@dataclass(frozen=True)
class Rendered:
    """The outcome of rendering one version: ``html`` or a ``failure`` key (below)."""

    html: str = ""
    failure: str = ""  # "slow", "invalid", "failed"

    @property
    def cost(self) -> int:
        return sys.getsizeof(self.html) + 200


class RenderBusy(Exception):
    """Too many versions wait for a render already."""


class TooLarge(Exception):
    """The notebook is over the size limit (not read)."""

    def __init__(self, size: int):
        super().__init__(f"{size} bytes")
        self.size = size


# ---- the notebook of a link, and its version -----------------------------------------

Key = tuple  # (owner, project, path, st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)


def _key(owner: str, project: str, path: str, st: os.stat_result) -> Key:
    return (owner, project, path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _open(projects_root, owner: str, project: str, path: str) -> tuple[int, os.stat_result]:
    """The notebook's descriptor (no link followed, a regular file) and its fstat."""
    parts = check_path(path)
    dir_fd = open_project_dir(projects_root, owner, project, parts[:-1])
    try:
        return safefs.open_file(parts[-1], dir_fd, path)
    except safefs.Refused as e:
        raise FileRefused(404, "The notebook of this link is not there any more.") from e
    finally:
        os.close(dir_fd)


def version_of(projects_root, owner: str, project: str, path: str) -> Key:
    """The notebook's current version (opened and closed; nothing read)."""
    fd, st = _open(projects_root, owner, project, path)
    os.close(fd)
    return _key(owner, project, path, st)


def read_version(projects_root, owner, project, path, limit: int) -> tuple[Key, bytes]:
    """The notebook's bytes (at most ``limit``) and the version they are: the key is
    None when the file changed while it was read (render it, but keep nothing)."""
    fd, st = _open(projects_root, owner, project, path)
    try:
        if st.st_size > limit:
            raise TooLarge(st.st_size)
        data = safefs.read_fd(fd, limit, path)
        after = os.fstat(fd)
    except safefs.Refused as e:  # it grew while it was read
        raise TooLarge(os.fstat(fd).st_size) from e
    finally:
        os.close(fd)
    before = _key(owner, project, path, st)
    return (before if before == _key(owner, project, path, after) else None), data


def size_of(key: Key) -> int:
    return key[5]


# ---- the cache -----------------------------------------------------------------------


class RenderCache:
    """Rendered versions, least recently used dropped first; at most ``max_bytes`` (a
    page over a quarter of it is not kept) and ``max_entries``. Event loop only."""

    def __init__(self, max_bytes: int, max_entries: int):
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self._items: OrderedDict[Key, Rendered] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Key) -> Rendered | None:
        found = self._items.get(key)
        if found is not None:
            self._items.move_to_end(key)
        return found

    def put(self, key: Key, value: Rendered) -> None:
        if key in self._items:
            self.bytes -= self._items.pop(key).cost
        if value.cost > self.max_bytes // 4:
            return
        # Older versions of the same notebook are never shown again.
        for old in [k for k in self._items if k[:3] == key[:3]]:
            self.bytes -= self._items.pop(old).cost
        self._items[key] = value
        self.bytes += value.cost
        while self._items and (self.bytes > self.max_bytes or len(self._items) > self.max_entries):
            _, dropped = self._items.popitem(last=False)
            self.bytes -= dropped.cost


# ---- the render process --------------------------------------------------------------


async def _read_bounded(stream: asyncio.StreamReader, limit: int) -> bytes | None:
    """At most ``limit`` bytes of ``stream`` until its end; None when it has more."""
    chunks, total = [], 0
    while chunk := await stream.read(2**16):
        total += len(chunk)
        if total > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def render_in_process(data: bytes, limits: GpulabPublicLinks, log=None) -> Rendered:
    """``data`` rendered by a fresh nbrender.py process within ``limits``."""
    timeout = limits.render_timeout_s
    args = [str(limits.max_bytes), str(limits.max_html_bytes)]
    args += [str(limits.render_memory_mib), str(int(timeout) + 2)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        str(CHILD),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # its own process group, killed whole
        env={"PATH": os.defpath, "LANG": "C.UTF-8", "HOME": "/nonexistent"},
    )

    async def feed():
        try:
            proc.stdin.write(data)
            await proc.stdin.drain()
            proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass  # it stopped reading: its exit status says why

    try:
        async with asyncio.timeout(timeout):
            _, out, err, rc = await asyncio.gather(
                feed(),
                _read_bounded(proc.stdout, limits.max_html_bytes),
                proc.stderr.read(STDERR_KEPT),
                proc.wait(),
            )
    except TimeoutError:
        return Rendered(failure="slow")
    finally:
        if proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await proc.wait()
    if rc == 0 and out is not None:
        return Rendered(html=out.decode("utf-8", "replace"))
    if rc == nbrender.NOT_NOTEBOOK:
        return Rendered(failure="invalid")
    if log is not None:
        log.warning("gpulab: a public notebook's render failed (%s): %s", rc, err[-500:])
    return Rendered(failure="failed")


# ---- one hub's renders ---------------------------------------------------------------


class PublicRenders:
    """One hub's cache, render slots and file threads (made at its first public view)."""

    def __init__(self, limits: GpulabPublicLinks, log=None):
        self.limits, self.log = limits, log
        self.cache = RenderCache(limits.cache_mib * 2**20, limits.cache_entries)
        self.slots = asyncio.Semaphore(limits.render_workers)
        self.pending: dict[Key, asyncio.Task] = {}
        self.renders = 0  # processes started, for the log and tests

    async def in_thread(self, fn, *args):
        """``fn(*args)`` on the hub's pool for public views (blocking.PUBLIC)."""
        return await blocking.run(blocking.PUBLIC, fn, *args)

    async def page(self, projects_root, link) -> tuple[Key, Rendered, str]:
        """The rendered notebook of ``link``, and how it came: "hit" (cached), "shared"
        (another view's render), "miss" (rendered for this view). FileRefused for a
        notebook gone, TooLarge for one over the size limit (not read), RenderBusy when
        too many versions wait for a render."""
        where = (projects_root, link.owner, link.project, link.path)
        key = await self.in_thread(version_of, *where)
        if size_of(key) > self.limits.max_bytes:
            raise TooLarge(size_of(key))
        found = self.cache.get(key)
        if found is not None:
            return key, found, "hit"
        task = self.pending.get(key)
        if task is not None:
            return key, await asyncio.shield(task), "shared"
        if len(self.pending) >= self.limits.render_queue:
            raise RenderBusy()
        task = asyncio.ensure_future(self._render(key, where))
        self.pending[key] = task
        task.add_done_callback(lambda _: self.pending.pop(key, None))
        return key, await asyncio.shield(task), "miss"

    async def _render(self, key: Key, where) -> Rendered:
        async with self.slots:
            read_key, data = await self.in_thread(read_version, *where, self.limits.max_bytes)
            self.renders += 1
            result = await render_in_process(data, self.limits, self.log)
        if read_key is not None:
            self.cache.put(read_key, result)
        if self.log is not None:
            self.log.info(
                "gpulab: rendered public notebook %s:%s (%d bytes): %s",
                key[1],
                key[2],
                len(data),
                result.failure or "ok",
            )
        return result


def renders_of(handler) -> PublicRenders:
    """The hub's PublicRenders (one per hub, with its configured limits)."""
    settings = handler.settings
    if "gpulab_public_renders" not in settings:
        limits = GpulabPublicLinks(config=settings["config"])
        settings["gpulab_public_renders"] = PublicRenders(limits, handler.log)
    return settings["gpulab_public_renders"]
