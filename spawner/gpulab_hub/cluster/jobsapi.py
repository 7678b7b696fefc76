"""``/hub/api/gpulab/cluster/jobs/<owner>/<project>[/<id>[/stop]]``: multi-node jobs of
a project on the Slurm cluster (JSON). A project's container cannot run sbatch, so its
jobs engine (gpulab_jupyter.jobs.cluster) asks the hub here.

- ``GET …/<owner>/<project>`` → ``{"jobs": [job, …], "cluster": bool}``, newest first;
- ``POST …/<owner>/<project>`` with ``{"id", "script", "args", "nodes",
  "gpus_per_node"}`` → ``201`` and the job (``id``: gpulab's job id, which names the
  project's ``jobs/<id>/`` folder);
- ``GET …/<id>`` → the job; ``POST …/<id>/stop`` → the job after ``scancel``.

Who may ask: the project server's own token (``$JUPYTERHUB_API_TOKEN`` in the project's
container, which everyone who runs code there can read) for its own project only;
the owner and collaborators (submit, list, stop), viewers (list and read only: 403 on
changes), with their token or their browser session; anyone else, an admin without a
share included, gets 404 (as for a project that does not exist), anonymous requests
403. On a hub that does not run on a cluster the list is empty and a submit is 409.
A mistake in the request is a 400 with the reason in the user's words.
"""

from __future__ import annotations

import asyncio
import json

from jupyterhub import orm
from jupyterhub.apihandlers import APIHandler
from jupyterhub.utils import url_escape_path, url_path_join
from tornado import web

from gpulab_contract.jobs import JOB_ID as JOB_ID_RE
from gpulab_hub import hubsettings
from gpulab_hub.cluster import ClusterError, jobs
from gpulab_hub.cluster.multinode import TrainRequest
from gpulab_hub.sharing import roles

API = "/api/gpulab/cluster/jobs"
JOB_ID = JOB_ID_RE.pattern  # the contract's job ids, matched whole in the routes
SERVER_TOKEN_NOTE = "Server at "  # how JupyterHub notes a server's own token
BODY_MAX_BYTES = 64 * 1024
WRITERS = ("server", "owner", "collaborator")
NO_CLUSTER = (
    "This gpulab runs its projects on one machine: multi-node jobs need gpulab on a Slurm "
    "cluster (docs/cluster.md). Use %gpu_job run without --nodes."
)


def hub_handlers() -> list[tuple]:
    """JupyterHub ``extra_handlers``."""
    base = API + r"/([^/]+)/([^/]+)"
    return [
        (base, "gpulab_hub.cluster.jobsapi.ProjectJobsHandler"),
        (base + rf"/({JOB_ID})", "gpulab_hub.cluster.jobsapi.JobHandler"),
        (base + rf"/({JOB_ID})/stop", "gpulab_hub.cluster.jobsapi.StopHandler"),
    ]


class _Base(APIHandler):
    def set_default_headers(self):
        super().set_default_headers()
        self.set_header("Cache-Control", "no-store")

    def access(self, owner: str, project: str) -> tuple[str, object]:
        """(role, the project's spawner): role "server", "owner", "collaborator" or
        "viewer"; 403 without credentials, 404 for everyone else."""
        current = self.current_user
        if current is None:
            raise web.HTTPError(403, "Log in or ask with a token.")
        missing = web.HTTPError(404, f"No project {owner}/{project}.")
        owner_row = orm.User.find(self.db, owner)
        spawner_row = owner_row.orm_spawners.get(project) if owner_row is not None else None
        if spawner_row is None or not project:
            raise missing
        hub_owner = self.users[owner_row]
        token = self.get_token()
        if token is not None and (token.note or "").startswith(SERVER_TOKEN_NOTE):
            own = url_path_join(hub_owner.base_url, url_escape_path(project), "/")
            if token.user_id == owner_row.id and token.note == SERVER_TOKEN_NOTE + own:
                return "server", hub_owner.spawners[project]
            raise missing
        person = getattr(current, "orm_user", None)
        server = f"server={owner}/{project}"
        if person is None or not self.has_scope(f"access:servers!{server}"):
            raise missing
        if person.id == owner_row.id:
            role = "owner" if self.has_scope(f"{roles.EXECUTE}!{server}") else "viewer"
        else:
            role = roles.role_on(self.db, person, spawner_row)
            if role == "collaborator" and not self.has_scope(f"{roles.EXECUTE}!{server}"):
                role = "viewer"
        if role not in ("owner", "collaborator", "viewer"):
            raise missing
        return role, hub_owner.spawners[project]

    def writer(self, owner: str, project: str):
        role, spawner = self.access(owner, project)
        if role not in WRITERS:
            raise web.HTTPError(
                403,
                f"You are a viewer of {owner}'s project {project}: you can see its jobs, "
                f"not start or stop them. Ask {owner} to make you a collaborator.",
            )
        return spawner

    def site(self, spawner) -> jobs.Site | None:
        if not callable(getattr(spawner, "job_site", None)):
            return None
        try:
            return spawner.job_site()
        except ClusterError as e:
            raise web.HTTPError(409, str(e)) from e

    def record(self) -> jobs.JobsRecord:
        return jobs.record_of(hubsettings.of_handler(self).records_dir)

    async def blocking(self, fn, *args):
        try:
            return await asyncio.to_thread(fn, *args)
        except ClusterError as e:
            raise web.HTTPError(400, str(e)) from e
        except LookupError:
            raise web.HTTPError(404, "No such job in this project.") from None
        except jobs.JobsRecord.Error as e:
            self.log.error("gpulab: multi-node jobs: %s", e)
            raise web.HTTPError(503, "The hub cannot read its record of jobs now.") from e

    def reply(self, body, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))


class ProjectJobsHandler(_Base):
    async def get(self, owner: str, project: str):
        _, spawner = self.access(owner, project)
        site = self.site(spawner)
        if site is None:
            self.reply({"jobs": [], "cluster": False})
            return
        found = await self.blocking(jobs.project_jobs, site, self.record(), owner, project)
        self.reply({"jobs": found, "cluster": True})

    async def post(self, owner: str, project: str):
        spawner = self.writer(owner, project)
        site = self.site(spawner)
        if site is None:
            raise web.HTTPError(409, NO_CLUSTER)
        req = parse_request(self.request.body)
        try:
            ref = await asyncio.to_thread(spawner.job_project)
        except ClusterError as e:
            raise web.HTTPError(409, str(e)) from e
        job = await self.blocking(jobs.submit, site, self.record(), ref, req)
        self.log.info(
            "gpulab: %s/%s submitted multi-node job %s (Slurm job %s: %d nodes, %d GPUs each)",
            owner, project, job["id"], job["slurm_job"], job["nodes"], job["gpus_per_node"],
        )  # fmt: skip
        self.reply(job, status=201)


class JobHandler(_Base):
    async def get(self, owner: str, project: str, job_id: str):
        _, spawner = self.access(owner, project)
        site = self.site(spawner)
        if site is None:
            raise web.HTTPError(404, "No such job in this project.")
        self.reply(await self.blocking(jobs.one_job, site, self.record(), owner, project, job_id))


class StopHandler(_Base):
    async def post(self, owner: str, project: str, job_id: str):
        spawner = self.writer(owner, project)
        site = self.site(spawner)
        if site is None:
            raise web.HTTPError(404, "No such job in this project.")
        job = await self.blocking(jobs.stop, site, self.record(), owner, project, job_id)
        self.log.info("gpulab: %s/%s stopped multi-node job %s", owner, project, job_id)
        self.reply(job)


def parse_request(body: bytes) -> TrainRequest:
    """The POST body as a request (its values are checked by multinode.check_request)."""
    if len(body) > BODY_MAX_BYTES:
        raise web.HTTPError(413, "The request is too large.")
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        raise web.HTTPError(400, "The request is not JSON.") from None
    if not isinstance(data, dict):
        raise web.HTTPError(400, "The request must be a JSON object.")
    unknown = set(data) - {"id", "script", "args", "nodes", "gpus_per_node"}
    if unknown:
        raise web.HTTPError(400, f"Unknown fields: {', '.join(sorted(unknown))}.")
    args = data.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise web.HTTPError(400, "args must be a list of strings.")
    nodes, gpus = data.get("nodes"), data.get("gpus_per_node", 0)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (nodes, gpus)):
        raise web.HTTPError(400, "nodes and gpus_per_node must be whole numbers.")
    job_id, script = data.get("id"), data.get("script")
    if not isinstance(job_id, str) or not isinstance(script, str):
        raise web.HTTPError(400, "id and script must be strings.")
    return TrainRequest(job_id, script, tuple(args), nodes, gpus)
