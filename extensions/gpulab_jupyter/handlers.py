"""REST handlers of the user side, under the versioned prefix /api/gpulab/v1/.

Every handler is ``@tornado.web.authenticated`` and asks the server's authorizer
(jupyter_server's ``@authorized``, resource ``gpulab``): under gpulab's hub a
"read" needs the ``custom:gpulab:read`` scope on this project, so only the
owner and the people it is shared with get answers (kernel ids and notebook
paths included). The GPU routes only read what the sampler thread left; the JSON
is documented in docs/gpu-status-api.md. The GPU status also says whether the hub
warned this project that it stops unless used (``reclaim``, asked of the hub with the
server's own token at most every ``RECLAIM_EVERY_S``).
"""

import asyncio
import json
import os
import time
from urllib.parse import quote

import tornado.web
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler

from gpulab_contract import environment

from . import devices

API_PREFIX = "api/gpulab/v1"


def image_state(environ) -> dict:
    """The image this project runs, for the user: ``state`` (``latest`` or
    ``last-good``: its Dockerfile's latest build, or the last one that built when that
    failed), ``note`` (one line) and ``build_log_url`` (a hub path, or ""). The
    contract's reader drops anything else (a project's Dockerfile can set them)."""
    env = environment.read(environ)
    return {"state": env.image_state, "note": env.image_note, "build_log_url": env.build_log_url}


def project_info(environ):
    """What this container knows about the project it serves (pure, for tests)."""
    env = environment.read(environ)
    return {
        "project": env.project,
        # the name the owner gave the project ("Alice First"), one line; else its id
        "display_name": env.display_name,
        "owner": env.owner,
        "workspace": env.workspace or os.getcwd(),
        "image": environ.get("JUPYTER_IMAGE_SPEC", ""),
        "image_state": image_state(environ),
    }


class _GPULabHandler(APIHandler):
    auth_resource = "gpulab"


class InfoHandler(_GPULabHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self):
        from . import __version__

        body = {"version": __version__, **project_info(os.environ), "refusal": ""}
        # Under gpulab's hub: what this person is told when a change is refused (a viewer).
        refusal = getattr(self.authorizer, "refusal", None)
        hub_user = getattr(self.current_user, "hub_user", None)
        if refusal is not None and hub_user is not None:
            body["refusal"] = await refusal(hub_user)
        self.finish(json.dumps(body))


class _SamplerHandler(_GPULabHandler):
    @property
    def sampler(self):
        return self.settings["gpulab_sampler"]

    def float_argument(self, name: str) -> float | None:
        raw = self.get_argument(name, None)
        if raw is None or raw == "":
            return None
        try:
            return float(raw)
        except ValueError:
            raise tornado.web.HTTPError(400, f"{name} must be a number of seconds") from None

    def write_json(self, body) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(body if isinstance(body, bytes) else json.dumps(body))


RECLAIM_EVERY_S = 30.0  # the hub is asked at most this often
RECLAIM_TIMEOUT_S = 5.0
RECLAIM_WORDS_MAX = 300


def reclaim_of(answer) -> dict | None:
    """The hub's reclaim answer (gpulab_hub/gpus/reclaimapi.py) as the status gives it:
    ``{"reason", "stops_at", "words"}`` while warned, else None (anything unexpected
    reads as not warned)."""
    if not isinstance(answer, dict) or answer.get("warned") is not True:
        return None
    stops_at, words = answer.get("stops_at"), answer.get("words")
    reason = answer.get("reason")
    if not isinstance(stops_at, int | float) or isinstance(stops_at, bool):
        return None
    if not isinstance(words, str) or not words or reason not in ("waiting", "idle"):
        return None
    return {
        "reason": reason,
        "stops_at": float(stops_at),
        "words": " ".join(words.split())[:RECLAIM_WORDS_MAX],
    }


class ReclaimWatch:
    """The hub's reclaim answer for this server's own project, asked at most every
    RECLAIM_EVERY_S (one request at a time, whoever polls); None outside a hub."""

    def __init__(self, environ=None):
        env = os.environ if environ is None else environ
        self.api = env.get("JUPYTERHUB_API_URL", "").rstrip("/")
        self.token = env.get("JUPYTERHUB_API_TOKEN", "")
        owner, project = env.get("JUPYTERHUB_USER", ""), env.get("JUPYTERHUB_SERVER_NAME", "")
        self.url = (
            f"{self.api}/gpulab/reclaim/{quote(owner, safe='')}/{quote(project, safe='')}"
            if self.api and self.token and owner and project
            else ""
        )
        self.value: dict | None = None
        self.asked = float("-inf")
        self._pending: asyncio.Future | None = None

    async def get(self) -> dict | None:
        if not self.url:
            return None
        if self._pending is None and time.monotonic() - self.asked >= RECLAIM_EVERY_S:
            self.asked = time.monotonic()
            self._pending = asyncio.ensure_future(self._ask())
        pending = self._pending
        if pending is not None:
            value = await asyncio.shield(pending)  # a poll that goes away leaves it running
            if self._pending is pending:
                self._pending = None
                self.value = value
        return self.value

    async def _ask(self) -> dict | None:
        from tornado.httpclient import AsyncHTTPClient, HTTPClientError

        try:
            r = await AsyncHTTPClient().fetch(
                self.url,
                headers={"Authorization": f"token {self.token}"},
                request_timeout=RECLAIM_TIMEOUT_S,
                connect_timeout=RECLAIM_TIMEOUT_S,
                follow_redirects=False,
                raise_error=False,
            )
        except (OSError, HTTPClientError):
            return self.value  # the hub did not answer: what it said last stands
        if r.code != 200 or len(r.body or b"") > 4096:
            return None if r.code == 404 else self.value
        try:
            return reclaim_of(json.loads(r.body))
        except ValueError:
            return None


class GPUStatusHandler(_SamplerHandler):
    """Now: every GPU of this container, or why there is none, and the hub's reclaim
    warning (``reclaim``). ``?interval=`` asks for a pace."""

    @tornado.web.authenticated
    @authorized
    async def get(self):
        self.sampler.request_interval(self.float_argument("interval"))
        watch = self.settings.setdefault("gpulab_reclaim_watch", ReclaimWatch())
        body = json.loads(self.sampler.status_body())
        body["reclaim"] = await watch.get()
        if "gpulab_gpu_sharing" not in self.settings:  # WSL2: shared, not measured
            self.settings["gpulab_gpu_sharing"] = devices.sharing_of()
        body["sharing"] = self.settings["gpulab_gpu_sharing"]
        self.write_json(body)


class GPUHistoryHandler(_SamplerHandler):
    """The last minutes, for sparklines; ``?since=<timestamp>`` gives only what is newer."""

    @tornado.web.authenticated
    @authorized
    def get(self):
        self.write_json(self.sampler.history(self.float_argument("since")))


def job_of(pid: int, ancestors: list[int], jobs: dict[int, str]) -> str | None:
    """The job a process belongs to: its own or an ancestor's PID is a running job's
    supervisor (``jobs``: supervisor PID → job id); None for any other process."""
    return next((jobs[p] for p in [pid, *ancestors] if p in jobs), None)


class GPUProcessesHandler(_SamplerHandler):
    """This container's processes on its GPUs, with their kernels and notebooks, and
    the job each runs for (``job``: its id, or null)."""

    @tornado.web.authenticated
    @authorized
    async def get(self):
        body = self.sampler.processes()
        kernels, by_pid = await self.kernels()
        jobs = await self.running_jobs() if body["processes"] else {}
        rows = []
        for row in body["processes"]:
            row = dict(row)
            kid = row.pop("kernel_id")
            ancestors = row.pop("ancestors")
            if kid not in kernels:
                kid = next((by_pid[p] for p in [row["pid"], *ancestors] if p in by_pid), None)
            row["kernel"] = kernels.get(kid)
            row["job"] = job_of(row["pid"], ancestors, jobs)
            rows.append(row)
        body["processes"] = rows
        self.write_json(body)

    async def running_jobs(self) -> dict[int, str]:
        """Running jobs by their supervisor's PID (the jobs engine reads files: a thread)."""
        engine = self.settings.get("gpulab_jobs")
        if engine is None:
            return {}
        from gpulab_jupyter.jobs.local import running_supervisors

        return await asyncio.get_running_loop().run_in_executor(None, running_supervisors, engine)

    async def kernels(self) -> tuple[dict, dict]:
        """This server's kernels by id (with their notebooks), and their PIDs."""
        km = self.kernel_manager
        kernels, by_pid = {}, {}
        for kid in km.list_kernel_ids():
            kernel = km.get_kernel(kid)
            kernels[kid] = {"id": kid, "name": kernel.kernel_name, "path": None, "session": None}
            pid = getattr(getattr(kernel, "provisioner", None), "pid", None)
            if pid:
                by_pid[pid] = kid
        for s in await self.session_manager.list_sessions():
            entry = kernels.get((s.get("kernel") or {}).get("id"))
            if entry is not None:
                entry.update(path=s.get("path"), session=s.get("name"), type=s.get("type"))
        return kernels, by_pid


def routes() -> list[tuple[str, type]]:
    """Every route of the extension (relative to the server's base URL)."""
    from .cells import routes as cell_routes
    from .idle import routes as idle_routes
    from .jobs.handlers import routes as job_routes

    return [
        (f"{API_PREFIX}/info", InfoHandler),
        (f"{API_PREFIX}/gpu", GPUStatusHandler),
        (f"{API_PREFIX}/gpu/history", GPUHistoryHandler),
        (f"{API_PREFIX}/gpu/processes", GPUProcessesHandler),
        *job_routes(API_PREFIX),
        *idle_routes(API_PREFIX),
        *cell_routes(API_PREFIX),
    ]
