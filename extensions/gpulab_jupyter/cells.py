"""Cells that run on the server, whether or not a browser is connected.

gpulab's cell executor (``src/cellexecutor.ts``) hands each code cell to
jupyter-server-nbmodel (``POST /api/kernels/<id>/execute``): the server runs it
through its own kernel client and writes its outputs into the notebook's shared
document (jupyter-collaboration), which saves itself to the .ipynb. This module
adds what gpulab needs around that:

- **what runs**: :data:`CELLS` knows the executions running now (cell, notebook,
  since when) and, through the library's own ``pending``, the ones queued;
  ``GET /api/gpulab/v1/cells`` says so (the lab's "running while you were away");
- **busy**: the activity reporter counts an executing or queued cell as activity
  (``activity.py``), so the idle culler and GPU reclaim spare the project;
- **the document stays**: jupyter-collaboration drops a notebook's document from
  memory ``document_cleanup_delay`` (60 s) after its last browser left; outputs
  written after that would reach no file. :func:`keep_rooms` makes that clean-up
  wait while a cell of the notebook runs or is queued, and then for the notebook's
  pending save;
- **bounded outputs**: ``outputbound.py``;
- **the first cell at once**: the library connects its kernel client (and waits
  for the kernel's handshake, 0.4 s at least) at a kernel's first cell; gpulab
  connects it as the kernel starts (:func:`connect_early`), while the person
  types, so a new notebook's first Shift+Enter waits for no more than the kernel.

Where jupyter-server-nbmodel or jupyter-collaboration is missing, nothing here is
active and cells run through the kernel as JupyterLab runs them.
"""

from __future__ import annotations

import asyncio
import json
import time

import tornado.web
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from traitlets import Bool, Float
from traitlets.config import Configurable

NBMODEL, YDOC = "jupyter_server_nbmodel", "jupyter_server_ydoc"


class ServerSideCells(Configurable):
    enabled = Bool(
        True,
        config=True,
        help="""Run notebook cells on the server's side (jupyter-server-nbmodel): outputs
        are written into the notebook and saved while no browser is connected. Off: cells
        run through the browser's kernel connection, as in a plain JupyterLab.
        Example: ``c.ServerSideCells.enabled = False``""",
    )
    keep_room_check_s = Float(
        5.0,
        config=True,
        help="""While a cell of a notebook nobody has open runs or is queued, how often
        (seconds) the notebook's document asks again whether it may leave memory.
        Example: ``c.ServerSideCells.keep_room_check_s = 10``""",
    )


class RunningCells:
    """The executions of this server: running ones (recorded as they start and end)
    and queued ones (asked of jupyter-server-nbmodel's execution stack)."""

    def __init__(self):
        self.running: dict[str, dict] = {}  # request id -> cell_id, path, since
        self.serverapp = None

    def start(self, metadata: dict | None) -> str:
        meta = metadata or {}
        key = str(meta.get("request_id") or id(meta))
        self.running[key] = {
            "cell_id": meta.get("cell_id"),
            "path": meta.get("document_path"),
            "since": time.time(),
        }
        return key

    def end(self, key: str) -> None:
        self.running.pop(key, None)

    def _stack(self):
        app = self.serverapp
        if app is None:
            return None
        for ext in app.extension_manager.extension_apps.get(NBMODEL, ()):
            stack = getattr(ext, "_Extension__execution_stack", None)
            if stack is not None:
                return stack
        return None

    def queued(self) -> list[dict]:
        """Requests accepted and not started yet (Run All's later cells)."""
        stack = self._stack()
        if stack is None:
            return []
        out = []
        for kernel_id in self.serverapp.kernel_manager.list_kernel_ids():
            for request in stack.pending(kernel_id):
                if request.get("request_status") == "queued":
                    out.append({"cell_id": request.get("cell_id"),
                                "path": request.get("document_path")})  # fmt: skip
        return out

    def busy(self) -> bool:
        return bool(self.running) or bool(self.queued())

    def busy_paths(self) -> set[str]:
        paths = {r["path"] for r in self.running.values()}
        paths |= {r["path"] for r in self.queued()}
        return {p for p in paths if isinstance(p, str)}

    def body(self, now: float) -> dict:
        """``GET .../cells``: what runs, since when, and how many wait."""
        running = sorted(self.running.values(), key=lambda r: r["since"])
        return {
            "running": [{**r, "seconds": round(max(0.0, now - r["since"]), 1)} for r in running],
            "queued": len(self.queued()),
        }


CELLS = RunningCells()


async def saved(room, timeout: float = 30.0) -> None:
    """Wait until ``room``'s pending save is done: jupyter-collaboration 5.0.4's clean-up
    stops the room, which cancels a save still waiting out ``document_save_delay``
    (``DocumentRoom.stop``), so outputs written in the last second before it (a cell
    that ended just then) would never reach the file."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        task = getattr(room, "_saving_document", None)
        if task is None or task.done():
            return
        await asyncio.wait({task}, timeout=max(0.0, deadline - time.monotonic()))


def keep_rooms(settings: ServerSideCells) -> bool:
    """jupyter-collaboration's room clean-up waits while a cell of that notebook runs
    or is queued (and nobody has come back); False where it is not installed."""
    try:
        from jupyter_server_ydoc.handlers import YDocWebSocketHandler
        from jupyter_server_ydoc.utils import decode_file_path
    except ImportError:
        return False
    original = YDocWebSocketHandler._clean_room
    if getattr(original, "__gpulab_keeps__", False):
        return True

    async def _clean_room(self):
        delay = self._cleanup_delay
        if delay:  # 0 or None: the library's own immediate or never
            await asyncio.sleep(delay)
            _, _, file_id = decode_file_path(self._room_id)
            path = self._file_id_manager.get_path(file_id)
            while path in CELLS.busy_paths():
                if getattr(self.room, "clients", None):
                    return  # someone is back (their close starts a new clean-up)
                await asyncio.sleep(settings.keep_room_check_s)
            await saved(self.room)
            self._cleanup_delay = 0
        return await original(self)

    _clean_room.__gpulab_keeps__ = True
    YDocWebSocketHandler._clean_room = _clean_room
    return True


def enabled_here(serverapp) -> bool:
    """Whether cells can run on the server here: both extensions loaded and enabled."""
    enabled = getattr(serverapp, "jpserver_extensions", {}) or {}
    apps = serverapp.extension_manager.extension_apps
    return all(enabled.get(name) and apps.get(name) for name in (NBMODEL, YDOC))


def connect_early(serverapp) -> None:
    """Connect the library's kernel client to each kernel as it starts: one connection
    per kernel, shared by the first cell when it comes before the handshake ended.
    Uses the library's private ``ExecutionStack._get_client`` (pinned ==0.2.9); the
    stack is looked up at a kernel's start (jupyter-server-nbmodel may load after
    gpulab's extension)."""
    km = serverapp.kernel_manager
    if getattr(km, "_gpulab_connects_early", False):
        return

    def shared(stack):
        """``stack._get_client``, each kernel's connection made once."""
        if getattr(stack, "_gpulab_shared_client", False):
            return stack._get_client
        get_client = stack._get_client
        connecting: dict[str, asyncio.Future] = {}

        async def shared_client(kernel_id: str):
            fut = connecting.get(kernel_id)
            if fut is None:
                fut = connecting[kernel_id] = asyncio.ensure_future(get_client(kernel_id))
                fut.add_done_callback(lambda _f: connecting.pop(kernel_id, None))
            return await asyncio.shield(fut)

        stack._get_client = shared_client
        stack._gpulab_shared_client = True
        return shared_client

    async def connect(kernel_id: str) -> None:
        stack = CELLS._stack()
        if stack is None or not hasattr(stack, "_get_client"):
            return
        t0 = time.monotonic()
        try:
            await shared(stack)(kernel_id)
        except Exception as e:  # noqa: BLE001 - the first cell connects again, and says why
            serverapp.log.warning("gpulab: no early connection to kernel %s: %s", kernel_id, e)
            return
        serverapp.log.info(
            "gpulab: the server's client of kernel %s connected in %.2f s",
            kernel_id,
            time.monotonic() - t0,
        )

    start_kernel = km.start_kernel

    async def start_and_connect(*args, **kwargs):
        kernel_id = await start_kernel(*args, **kwargs)
        task = asyncio.ensure_future(connect(kernel_id))
        _EARLY.add(task)
        task.add_done_callback(_EARLY.discard)
        return kernel_id

    km.start_kernel = start_and_connect
    km._gpulab_connects_early = True


_EARLY: set[asyncio.Task] = set()  # the early connections under way (kept referenced)


def install(extension) -> bool:
    """Turn server-side cells on for ``extension``'s server, where they can be."""
    from .outputbound import OutputBounds
    from .outputbound import install as bound_outputs

    settings = ServerSideCells(parent=extension)
    serverapp = extension.serverapp
    page_config = serverapp.web_app.settings.setdefault("page_config_data", {})
    if not settings.enabled or not enabled_here(serverapp):
        page_config["gpulabServerSideExecution"] = False
        return False
    CELLS.serverapp = serverapp
    bounds = OutputBounds(parent=extension)
    if not (bound_outputs(bounds, CELLS) and keep_rooms(settings)):
        page_config["gpulabServerSideExecution"] = False
        return False
    page_config["gpulabServerSideExecution"] = True
    serverapp.web_app.settings["gpulab_cells"] = CELLS
    connect_early(serverapp)
    return True


class CellsHandler(APIHandler):
    auth_resource = "gpulab"
    _track_activity = False  # asked on a timer

    @tornado.web.authenticated
    @authorized
    def get(self):
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(CELLS.body(time.time())))


def routes(prefix: str) -> list[tuple[str, type]]:
    return [(f"{prefix}/cells", CellsHandler)]
