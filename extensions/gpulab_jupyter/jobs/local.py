"""Jobs in this container: each one a supervisor process in a session of its own,
its files in ``<project>/jobs/<id>/`` (``job.json``, ``state.json``,
``result.json``, ``output.log``), where a new server, kernel or hub finds them."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from gpulab_contract import environment
from gpulab_jupyter.jobs import launch
from gpulab_jupyter.jobs.engine import this_machine
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
from gpulab_jupyter.jobs.supervise import STOP_GRACE_S

LIST_MAX = 200
START_WAIT_S = 10.0
ONE_MACHINE = (
    "--nodes starts a job on several machines of a Slurm cluster, and this project runs "
    "on one machine. Run it without --nodes (--gpus all uses every GPU of this project)."
)


class LocalEngine:
    """Runs jobs in this container (the project's, on the project's GPUs)."""

    def __init__(self, project: Path, python: str = sys.executable, machine=None):
        self.project = Path(project)
        self.root = self.project / "jobs"
        self.python = python
        self._machine = machine

    @property
    def machine(self) -> launch.Machine:
        if self._machine is None:
            self._machine = this_machine()
        return self._machine

    def _folder(self, job_id: str) -> Path:
        folder = self.root / check_id(job_id)
        if folder.is_symlink() or not folder.is_dir():
            raise JobError(f"No job {job_id} in this project.")
        return folder

    def start(self, req: JobRequest, extra_env: Mapping[str, str] | None = None) -> JobRecord:
        """Start ``req``; its processes get this process's environment plus
        ``extra_env`` (the starter's secrets, when the jobs API starts it)."""
        req = check_request(req, self.project)
        if req.nodes:
            raise JobError(ONE_MACHINE)
        job_id = new_id()
        output = ""
        if req.kind == "notebook":
            stem = req.target[: -len(".ipynb")]
            output = f"{stem}.job-{job_id}.ipynb"
        # Only a job that asks about GPUs makes NVML look at them.
        needs_gpus = bool(req.gpus) or req.precision == "auto"
        machine = self.machine if needs_gpus else launch.Machine()
        argv = launch.command(req, machine, self.python, output)
        env = launch.environment(req, machine, {**os.environ, **(extra_env or {})})
        env.update(environment.build(job_id=job_id))  # as the hub names a multi-node job
        if req.kind == "command":
            _find_program(req.command[0], env.get("PATH", os.defpath), self.project)
        if self.root.is_symlink():
            raise JobError("The project's jobs folder is a link: remove it and try again.")
        self.root.mkdir(exist_ok=True)
        folder = self.root / job_id
        folder.mkdir()
        record = JobRecord(
            id=job_id,
            request=dataclasses.asdict(req),
            argv=argv,
            started=time.time(),
            output=output,
            extra={"cwd": str(self.project)},
        )
        write_json(folder / "job.json", record.to_dict())
        subprocess.Popen(
            [self.python, "-m", "gpulab_jupyter.jobs.supervise", str(folder)],
            cwd=self.project,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + START_WAIT_S
        begun = (folder / "state.json", folder / "result.json")
        while not any(p.exists() for p in begun) and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.status(job_id)

    def status(self, job_id: str) -> JobRecord:
        folder = self._folder(job_id)
        job = read_json(folder / "job.json")
        if job is None:
            raise JobError(f"Job {job_id} has no readable record (jobs/{job_id}/job.json).")
        fields = {f.name for f in dataclasses.fields(JobRecord)}
        record = JobRecord(**{k: v for k, v in job.items() if k in fields})
        result = read_json(folder / "result.json")
        state = read_json(folder / "state.json")
        if result is not None:
            record.state = str(result.get("state", "failed"))
            record.exit_code = result.get("exit_code")
            record.ended = result.get("ended")
            record.message = str(result.get("message", ""))
        elif state is not None:
            record.pid = state.get("pid")
            if _supervising(record.pid, folder):
                record.state = "running"
            else:
                record.state = "lost"
                record.message = (
                    "its process is gone without a result: the project stopped or "
                    "restarted while the job ran"
                )
        elif time.time() - record.started > START_WAIT_S * 3:
            record.state, record.message = "lost", "it never started"
        return record

    def logs(self, job_id: str, tail_bytes: int = 65536) -> str:
        path = self._folder(job_id) / "output.log"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return ""
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - tail_bytes))
            return f.read(tail_bytes).decode("utf-8", "replace")

    def stop(self, job_id: str) -> JobRecord:
        record = self.status(job_id)
        if record.state in FINISHED:
            return record
        folder = self._folder(job_id)
        state = read_json(folder / "state.json") or {}
        if _supervising(state.get("pid"), folder):
            os.kill(state["pid"], signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S + 5
        while not (folder / "result.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        if not (folder / "result.json").exists():
            for pid, kill in ((state.get("child"), os.killpg), (state.get("pid"), os.kill)):
                if isinstance(pid, int) and pid > 1:
                    try:
                        kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
            write_json(
                folder / "result.json",
                {"state": "stopped", "exit_code": None, "ended": time.time(),
                 "message": "stopped by its user (killed)"},
            )  # fmt: skip
        return self.status(job_id)

    def rerun(self, job_id: str, extra_env: Mapping[str, str] | None = None) -> JobRecord:
        return self.start(JobRequest.of(self.status(job_id).request), extra_env)

    def list(self) -> list[JobRecord]:
        if not self.root.is_dir() or self.root.is_symlink():
            return []
        ids = sorted(
            (e.name for e in os.scandir(self.root) if JOB_ID.fullmatch(e.name)), reverse=True
        )
        records = []
        for job_id in ids[:LIST_MAX]:
            try:
                records.append(self.status(job_id))
            except JobError:
                continue
        return records


def _find_program(program: str, path: str, project: Path) -> None:
    """A command's program is there before its job is made (a path is checked with the
    request: model.check_command); a name must be on the job's PATH."""
    if "/" in program:
        if program.startswith("/") and not os.access(program, os.X_OK):
            raise JobError(f"{program}: no such program in this project's container.")
        return
    if shutil.which(program, path=path) is None:
        raise JobError(
            f"{program}: no such command in this project's container (not on its PATH). "
            f"Install it in the project's Dockerfile (or %gpu_install it), or name a file: "
            f"-- ./{program}."
        )


def any_running(engine) -> bool:
    """Whether a job runs now (the server then reports activity, so the idle culler
    leaves the project alone)."""
    try:
        return any(r.state in ("running", "starting") for r in engine.list())
    except (JobError, OSError):
        return False


def running_supervisors(engine) -> dict[int, str]:
    """Running jobs by their supervisor's PID (the GPU process list names a process's
    job from its ancestors)."""
    try:
        records = engine.list()
    except (JobError, OSError):
        return {}
    return {r.pid: r.id for r in records if r.state == "running" and isinstance(r.pid, int)}


def _supervising(pid, folder: Path) -> bool:
    """Whether ``pid`` is this job's supervisor (not a process that reused the pid)."""
    if not isinstance(pid, int) or pid <= 1:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"gpulab_jupyter.jobs.supervise" in cmdline and str(folder).encode() in cmdline
