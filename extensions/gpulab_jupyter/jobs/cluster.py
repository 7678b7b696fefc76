"""Jobs of a project that runs on gpulab's Slurm cluster (the spawner sets
``GPULAB_JOBS_ENGINE=cluster`` in the project's container).

A job without ``--nodes`` runs in this container, as on one machine (LocalEngine).
A multi-node job (``--nodes N --gpus-per-node G``) is a Slurm batch job the hub submits
(this container cannot run sbatch): :class:`HubJobs` asks the hub's API
(``/hub/api/gpulab/cluster/jobs/<owner>/<project>``) with the project server's own
token; the job's folder ``jobs/<id>/`` is made here first and holds ``job.json``, each
node's output (``output.log`` for the first node, ``output-node<k>.log`` for the
others, written by the job's containers: gpulab_jupyter.jobs.node) and, once the job
ended, ``result.json``. The job's state comes from the hub while Slurm runs it, and
from the nodes' results (``node-<k>.json``) when it ended.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

from gpulab_contract import environment
from gpulab_jupyter.jobs.local import LIST_MAX, LocalEngine
from gpulab_jupyter.jobs.model import (
    FINISHED,
    JOB_ID,
    JobError,
    JobRecord,
    JobRequest,
    check_id,
    check_request,
    new_id,
    read_json,
    write_json,
)
from gpulab_jupyter.jobs.node import log_name, result_name

CLUSTER = environment.CLUSTER
TIMEOUT_S = 30.0
ANSWER_MAX_BYTES = 1024 * 1024
WAITING = ("PENDING", "CONFIGURING")
STOP_WAIT_S = 60.0
# What _record knows of the hub's view of a job, besides the view itself.
ASK, MISSING, UNREACHABLE = "ask", "missing", "unreachable"


class NotFound(JobError):
    """The hub has no such job (404)."""


class HubJobs:
    """The hub's API of this project's multi-node jobs, asked with the server's token."""

    def __init__(self, api_url: str, token: str, owner: str, project: str):
        self.url = (
            f"{api_url.rstrip('/')}/gpulab/cluster/jobs/{quote(owner, safe='')}/"
            f"{quote(project, safe='')}"
        )
        self.token = token

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> HubJobs:
        missing = [
            k
            for k in ("JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN", "JUPYTERHUB_USER")
            if not environ.get(k)
        ]
        if missing:
            raise JobError(
                f"This project cannot reach gpulab's hub ({', '.join(missing)} unset): "
                "multi-node jobs need the project started by the hub."
            )
        return cls(
            environ["JUPYTERHUB_API_URL"],
            environ["JUPYTERHUB_API_TOKEN"],
            environ["JUPYTERHUB_USER"],
            environ.get("JUPYTERHUB_SERVER_NAME", ""),
        )

    def _call(self, method: str, path: str = "", body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:  # noqa: S310
                raw = response.read(ANSWER_MAX_BYTES + 1)
        except urllib.error.HTTPError as e:
            raise (NotFound if e.code == 404 else JobError)(_message(e)) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise JobError(
                f"gpulab's hub does not answer ({reason}): try again in a moment."
            ) from None
        if len(raw) > ANSWER_MAX_BYTES:
            raise JobError("gpulab's hub gave an answer too large to read.")
        try:
            answer = json.loads(raw)
        except ValueError:
            raise JobError("gpulab's hub gave an answer that is not JSON.") from None
        if not isinstance(answer, dict):
            raise JobError("gpulab's hub gave an answer gpulab cannot use.")
        return answer

    def submit(self, body: dict) -> dict:
        return self._call("POST", "", body)

    def jobs(self) -> list[dict]:
        found = self._call("GET").get("jobs")
        return [j for j in found if isinstance(j, dict)] if isinstance(found, list) else []

    def job(self, job_id: str) -> dict:
        return self._call("GET", f"/{check_id(job_id)}")

    def stop(self, job_id: str) -> dict:
        return self._call("POST", f"/{check_id(job_id)}/stop", {})


def _message(e: urllib.error.HTTPError) -> str:
    """The hub's words of a refusal (its JSON ``message``), one line."""
    try:
        message = json.loads(e.read(65536) or b"{}").get("message", "")
    except (ValueError, AttributeError, OSError):
        message = ""
    words = " ".join(str(message or e.reason or "").split())[:500]
    return words or f"gpulab's hub answered {e.code}."


class ClusterEngine:
    """Jobs of a project on the cluster: one-machine jobs here, multi-node ones through
    the hub (see the module's doc)."""

    def __init__(self, project: Path, hub: HubJobs | None = None, local: LocalEngine | None = None):
        self.project = Path(project)
        self.local = local or LocalEngine(self.project)
        self.root = self.local.root
        self._hub = hub

    @property
    def hub(self) -> HubJobs:
        if self._hub is None:
            self._hub = HubJobs.from_environ()
        return self._hub

    def _folder(self, job_id: str) -> Path:
        return self.local._folder(job_id)

    def _is_cluster(self, job_id: str) -> bool:
        job = read_json(self._folder(job_id) / "job.json") or {}
        extra = job.get("extra")
        return isinstance(extra, dict) and extra.get("engine") == CLUSTER

    # --- the engine's five calls ------------------------------------------------------

    def start(self, req: JobRequest, extra_env: Mapping[str, str] | None = None) -> JobRecord:
        if not req.nodes:
            return self.local.start(req, extra_env)
        req = check_request(req, self.project)
        job_id = new_id()
        if self.root.is_symlink():
            raise JobError("The project's jobs folder is a link: remove it and try again.")
        self.root.mkdir(exist_ok=True)
        folder = self.root / job_id
        folder.mkdir()
        record = JobRecord(
            id=job_id,
            request=dataclasses.asdict(req),
            argv=["torchrun", f"--nnodes={req.nodes}",
                  f"--nproc-per-node={max(1, req.gpus_per_node)}", req.target, *req.args],
            started=time.time(),
            extra={"engine": CLUSTER},
        )  # fmt: skip
        write_json(folder / "job.json", record.to_dict())
        body = {
            "id": job_id,
            "script": req.target,
            "args": list(req.args),
            "nodes": req.nodes,
            "gpus_per_node": req.gpus_per_node,
        }
        try:
            answer = self.hub.submit(body)
        except JobError:
            shutil.rmtree(folder, ignore_errors=True)  # no job came to be
            raise
        record.extra["slurm_job"] = answer.get("slurm_job")
        write_json(folder / "job.json", record.to_dict())
        write_json(folder / "state.json", {"state": "submitted", "engine": CLUSTER})
        return self._record(job_id, answer)

    def status(self, job_id: str) -> JobRecord:
        if not self._is_cluster(job_id):
            return self.local.status(job_id)
        return self._record(job_id)

    def logs(self, job_id: str, tail_bytes: int = 65536) -> str:
        """The first node's output, then each other node's (``%gpu_job logs``, the Jobs
        panel's log tail)."""
        if not self._is_cluster(job_id):
            return self.local.logs(job_id, tail_bytes)
        record = self.status(job_id)
        parts = [self._read(job_id, 0, tail_bytes)]
        for rank in range(1, _nodes(record)):
            text = self._read(job_id, rank, tail_bytes)
            parts.append(f"\n[gpulab-job] ----- node {rank} ({_log_path(job_id, rank)}) -----\n")
            parts.append(text)
        return "".join(parts) + self._failure_lines(record)

    def stream(self, job_id: str, tail_bytes: int = 65536) -> str:
        """What following a job prints: text that only grows (the first node's output;
        the other nodes' once the job ended)."""
        if not self._is_cluster(job_id):
            return self.local.logs(job_id, tail_bytes)
        record = self.status(job_id)
        if record.state not in FINISHED:
            return self._read(job_id, 0, tail_bytes)
        return self.logs(job_id, tail_bytes)

    def stop(self, job_id: str) -> JobRecord:
        if not self._is_cluster(job_id):
            return self.local.stop(job_id)
        record = self.status(job_id)
        if record.state in FINISHED:
            return record
        self.hub.stop(job_id)
        # Until Slurm has ended it on every node (each task's trap removes its container;
        # the Epilog runs before the job leaves COMPLETING), bounded.
        deadline = time.monotonic() + STOP_WAIT_S
        record = self._record(job_id)
        while record.state not in FINISHED and time.monotonic() < deadline:
            time.sleep(0.5)
            record = self._record(job_id)
        return record

    def rerun(self, job_id: str, extra_env: Mapping[str, str] | None = None) -> JobRecord:
        return self.start(JobRequest.of(self.status(job_id).request), extra_env)

    def list(self) -> list[JobRecord]:
        if not self.root.is_dir() or self.root.is_symlink():
            return []
        ids = sorted(
            (e.name for e in os.scandir(self.root) if JOB_ID.fullmatch(e.name)), reverse=True
        )[:LIST_MAX]
        hub_jobs: dict[str, dict] | str | None = None
        records = []
        for job_id in ids:
            try:
                if not self._is_cluster(job_id):
                    records.append(self.local.status(job_id))
                    continue
                if hub_jobs is None and not (self._folder(job_id) / "result.json").exists():
                    hub_jobs = self._hub_jobs()
                if isinstance(hub_jobs, dict):
                    records.append(self._record(job_id, hub_jobs.get(job_id, MISSING)))
                else:
                    records.append(self._record(job_id, hub_jobs or ASK))
            except JobError:
                continue
        return records

    # --- a multi-node job's record ---------------------------------------------------

    def _hub_jobs(self) -> dict[str, dict] | str:
        try:
            return {j.get("id"): j for j in self.hub.jobs()}
        except JobError:
            return UNREACHABLE

    def _record(self, job_id: str, hub: dict | str = ASK) -> JobRecord:
        """The job's record: its final result once written, else from the hub's view
        (asked when ``hub`` is ASK; MISSING: the hub has no such job; UNREACHABLE) and
        the nodes' results."""
        folder = self._folder(job_id)
        job = read_json(folder / "job.json")
        if job is None:
            raise JobError(f"Job {job_id} has no readable record (jobs/{job_id}/job.json).")
        names = {f.name for f in dataclasses.fields(JobRecord)}
        record = JobRecord(**{k: v for k, v in job.items() if k in names})
        result = read_json(folder / "result.json")
        if result is not None:
            record.state = str(result.get("state", "failed"))
            record.exit_code = result.get("exit_code")
            record.ended = result.get("ended")
            record.message = str(result.get("message", ""))
            record.extra["failure"] = result.get("failure") or []
            return record
        if hub == ASK:
            try:
                hub = self.hub.job(job_id)
            except NotFound:
                hub = MISSING
            except JobError as e:
                record.message = str(e)
                hub = UNREACHABLE
        if hub == UNREACHABLE:  # say so, decide nothing
            record.state = "running"
            record.message = record.message or "gpulab's hub does not answer: state unknown"
            return record
        view = hub if isinstance(hub, dict) else {}
        record.extra["failure"] = list(view.get("failure") or [])
        if view and not view.get("ended"):
            record.state = "starting" if view.get("state") in WAITING else "running"
            words = str(view.get("words") or "")
            progress = str(view.get("progress") or "")
            waiting = progress and record.state == "starting"
            record.message = f"{words}: {progress}" if waiting else words
            return record
        self._finish(folder, record, view)
        return record

    def _finish(self, folder: Path, record: JobRecord, view: dict) -> None:
        """Decide how the ended job went, and keep it in result.json."""
        nodes = _nodes(record)
        codes = {}
        ended = [float(view["ended"])] if isinstance(view.get("ended"), int | float) else []
        for rank in range(nodes):
            node = read_json(folder / result_name(rank))
            if node is not None and isinstance(node.get("exit_code"), int):
                codes[rank] = node["exit_code"]
                if isinstance(node.get("ended"), int | float):
                    ended.append(float(node["ended"]))
        failure = record.extra.get("failure") or []
        bad = {r: c for r, c in codes.items() if c != 0}
        if view.get("stop_requested") or view.get("state") == "CANCELLED":
            state, message = "stopped", "stopped by its user"
        elif len(codes) == nodes and not bad:
            state, message = "succeeded", f"finished on {nodes} nodes"
        elif bad:
            rank, code = min(bad.items())
            state, message = "failed", f"exit code {code} on node {rank}"
            record.exit_code = code
        elif failure:
            state, message = "failed", failure[0]
        elif view:
            state, message = "failed", str(view.get("words") or "ended without a result")
        else:
            state, message = "lost", "gpulab's hub has no record of it and no node left a result"
        record.state, record.message = state, message
        record.ended = max(ended) if ended else time.time()
        if state == "succeeded":
            record.exit_code = 0
        write_json(
            folder / "result.json",
            {"state": state, "exit_code": record.exit_code, "ended": record.ended,
             "message": message, "failure": failure},
        )  # fmt: skip

    def _read(self, job_id: str, rank: int, tail_bytes: int) -> str:
        path = self._folder(job_id) / log_name(rank)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return ""
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - tail_bytes))
            return f.read(tail_bytes).decode("utf-8", "replace")

    @staticmethod
    def _failure_lines(record: JobRecord) -> str:
        lines = record.extra.get("failure") or []
        return "".join(f"[gpulab-job] gpulab: {line}\n" for line in lines if isinstance(line, str))


def _nodes(record: JobRecord) -> int:
    nodes = record.request.get("nodes") if isinstance(record.request, dict) else 0
    return nodes if isinstance(nodes, int) and 0 < nodes <= 1024 else 1


def _log_path(job_id: str, rank: int) -> str:
    return f"jobs/{job_id}/{log_name(rank)}"


def engine_for(project: Path, environ: Mapping[str, str] = os.environ):
    """The jobs engine of this project: the cluster's where the spawner says so."""
    if environment.read(environ).cluster_jobs:
        return ClusterEngine(project)
    return LocalEngine(project)
