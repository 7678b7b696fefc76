"""The jobs routes of the server extension, under /api/gpulab/v1/jobs (the Jobs panel
and the hub read them; docs/jobs.md has the JSON).

Reading (GET) needs the ``read`` scope on the project, like every gpulab route;
starting, stopping and re-running are "write" requests of resource ``gpulab``, which
gpulab's authorizer gives only to those who may execute code here (the owner and
collaborators, never viewers). A job started or re-run here gets the secrets of the
person who asked (secrets/deliver.py). Engine calls block (a stop waits for the job
to end), so they run on a worker thread.
"""

from __future__ import annotations

import asyncio
import json

import tornado.web
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from gpulab_contract.text import strip_ansi
from gpulab_jupyter.jobs.model import JOB_ID, JobError, JobRecord, JobRequest, command_line
from gpulab_jupyter.secrets import deliver

LOG_TAIL_BYTES = 16384
BODY_MAX_BYTES = 64 * 1024
ACTIONS = ("stop", "rerun")


def plain(text: str) -> str:
    """Log text without terminal escape codes (colours, cursor moves)."""
    return strip_ansi(text)


def record_json(record: JobRecord, log_tail: str | None = None) -> dict:
    body = record.to_dict()
    body.pop("extra", None)  # where the job runs (the container's paths): not needed
    body["command_line"] = command_line(record.request)  # what it runs, as the user typed it
    if log_tail is not None:
        body["log_tail"] = plain(log_tail)
    return body


class _JobsHandler(APIHandler):
    auth_resource = "gpulab"

    @property
    def engine(self):
        return self.settings["gpulab_jobs"]

    async def call(self, fn, *args):
        try:
            return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
        except JobError as e:
            raise tornado.web.HTTPError(400, str(e)) from None

    @staticmethod
    def secrets_env() -> dict[str, str] | None:
        """What the job's environment gets for the person who starts it (the authorizer
        fetched it for this request)."""
        delivery = deliver.current.get()
        return delivery.additions() if delivery is not None else None

    def reply(self, body, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))


class JobsHandler(_JobsHandler):
    def gpulab_starts_process(self) -> bool:
        return self.request.method == "POST"

    @tornado.web.authenticated
    @authorized
    async def get(self):
        records = await self.call(self.engine.list)
        self.reply({"jobs": [record_json(r) for r in records]})

    @tornado.web.authenticated
    @authorized
    async def post(self):
        if len(self.request.body) > BODY_MAX_BYTES:
            raise tornado.web.HTTPError(413, "The request is too large.")
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            raise tornado.web.HTTPError(400, "The request is not JSON.") from None
        if not isinstance(body, dict):
            raise tornado.web.HTTPError(400, "The request must be a JSON object.")
        args, command = body.get("args", []), body.get("command", [])
        fields = (body.get(k, "") for k in ("target", "gpus", "precision", "name"))
        for key, words in (("args", args), ("command", command)):
            if not isinstance(words, list) or not all(isinstance(a, str) for a in words):
                raise tornado.web.HTTPError(400, f"{key} must be a list of strings.")
        target, gpus, precision, name = fields
        if not all(isinstance(v, str) for v in (target, gpus, precision, name)):
            raise tornado.web.HTTPError(400, "target, gpus, precision and name are strings.")
        nodes, per_node = body.get("nodes", 0), body.get("gpus_per_node", 0)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (nodes, per_node)):
            raise tornado.web.HTTPError(400, "nodes and gpus_per_node are whole numbers.")
        record = await self.call(
            self.engine.start,
            JobRequest(target, tuple(args), gpus, precision, name, nodes, per_node, tuple(command)),
            self.secrets_env(),
        )
        self.set_header("Location", url_path_join(self.base_url, "api/gpulab/v1/jobs", record.id))
        self.reply(record_json(record), status=201)


class JobHandler(_JobsHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self, job_id: str):
        record = await self.call(self.engine.status, job_id)
        tail = await self.call(self.engine.logs, job_id, LOG_TAIL_BYTES)
        self.reply(record_json(record, tail))


class JobActionHandler(_JobsHandler):
    def gpulab_starts_process(self) -> bool:
        return self.request.method == "POST" and self.path_args[-1:] == ["rerun"]

    @tornado.web.authenticated
    @authorized
    async def post(self, job_id: str, action: str):
        if action == "stop":
            self.reply(record_json(await self.call(self.engine.stop, job_id)))
        else:
            rerun = self.engine.rerun
            self.reply(record_json(await self.call(rerun, job_id, self.secrets_env())))


def routes(prefix: str = "api/gpulab/v1") -> list[tuple[str, type]]:
    """Relative route patterns (the extension prefixes the server's base URL)."""
    job = JOB_ID.pattern
    return [
        (rf"{prefix}/jobs", JobsHandler),
        (rf"{prefix}/jobs/({job})", JobHandler),
        (rf"{prefix}/jobs/({job})/({'|'.join(ACTIONS)})", JobActionHandler),
    ]
