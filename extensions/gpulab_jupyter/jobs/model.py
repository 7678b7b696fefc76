"""A job's request and record, and the checks on everything a user hands in."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Job ids are made here; anything that names one is matched whole against this.
JOB_ID = re.compile(r"\d{8}-\d{6}-[a-z0-9]{4}")
# A job's name: what the user called it (shown in lists), plain and short.
JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._ -]{0,63}")
PRECISIONS = ("auto", "bf16", "fp16", "fp32", "")
STATES = ("starting", "running", "succeeded", "failed", "stopped", "lost")
FINISHED = ("succeeded", "failed", "stopped", "lost")
MAX_ARGS = 256
MAX_ARG_LEN = 4096
MAX_NODES = 99
RECORD_MAX_BYTES = 256 * 1024


class JobError(Exception):
    """What went wrong, in the user's words."""


@dataclass(frozen=True)
class JobRequest:
    """What the user asked for: a script (with arguments) or a notebook."""

    target: str  # a .py or .ipynb path, relative to the project folder
    args: tuple[str, ...] = ()
    gpus: str = ""  # "" (the project's GPUs, one process), "all" (torchrun), or a count
    precision: str = ""
    name: str = ""
    nodes: int = 0  # 0: this container; N: a multi-node job on the cluster (torchrun)
    gpus_per_node: int = 0  # GPUs on each node of a multi-node job (0: CPUs only)

    @property
    def kind(self) -> str:
        return "notebook" if self.target.endswith(".ipynb") else "script"

    @classmethod
    def of(cls, request: dict) -> JobRequest:
        """The request a job record keeps (``JobRecord.request``), for a re-run."""
        known = {f.name for f in dataclasses.fields(cls)}
        req = {k: v for k, v in request.items() if k in known}
        req["args"] = tuple(req.get("args") or ())
        return cls(**req)


@dataclass
class JobRecord:
    """What ``job.json`` (written once at start) and ``result.json`` (at the end) hold."""

    id: str
    request: dict
    argv: list[str]
    started: float
    state: str = "starting"
    ended: float | None = None
    exit_code: int | None = None
    pid: int | None = None  # the supervisor's
    message: str = ""
    output: str = ""  # the executed notebook, for notebook jobs (project-relative)
    extra: dict = field(default_factory=dict)

    @property
    def elapsed(self) -> float:
        return (self.ended or time.time()) - self.started

    def to_dict(self) -> dict:
        d = asdict(self)
        d["elapsed"] = round(self.elapsed, 1)
        return d


def new_id(now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now or time.time()))
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return f"{stamp}-{''.join(secrets.choice(alphabet) for _ in range(4))}"


def check_id(job_id: str) -> str:
    if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
        raise JobError(f"{job_id!r} is not a job id (they look like 20261123-141502-a1b2).")
    return job_id


def check_request(req: JobRequest, project: Path) -> JobRequest:
    """The request, checked: a file in the project (no link leaves it), sane arguments."""
    if req.precision not in PRECISIONS:
        raise JobError(f"--precision must be one of: {', '.join(p for p in PRECISIONS if p)}.")
    if req.gpus not in ("", "all") and not re.fullmatch(r"[1-9][0-9]?", req.gpus):
        raise JobError("--gpus must be 'all' or a number of GPUs (1-99).")
    if req.name and not JOB_NAME.fullmatch(req.name):
        raise JobError("A job name is letters, digits, '.', '_', '-' and spaces (64 at most).")
    if len(req.args) > MAX_ARGS or any(len(a) > MAX_ARG_LEN or "\0" in a for a in req.args):
        raise JobError(f"Too many or too long arguments (at most {MAX_ARGS}).")
    if req.kind == "notebook" and req.args:
        raise JobError("A notebook job takes no arguments (use a script for that).")
    if req.kind == "notebook" and req.gpus == "all":
        raise JobError("--gpus all starts one process per GPU: that needs a script.")
    check_nodes(req)
    resolve_target(project, req.target)
    return req


def _count(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_NODES:
        raise JobError(f"{what} must be a whole number from 1 to {MAX_NODES}.")
    return value


def check_nodes(req: JobRequest) -> None:
    """A multi-node request (``--nodes``, ``--gpus-per-node``) that makes sense."""
    nodes = _count(req.nodes, "--nodes")
    gpus = _count(req.gpus_per_node, "--gpus-per-node")
    if not nodes:
        if gpus:
            raise JobError(
                "--gpus-per-node goes with --nodes (a job on several machines); for the "
                "GPUs of this project use --gpus."
            )
        return
    if req.kind == "notebook":
        raise JobError("A multi-node job runs a Python script with torchrun, not a notebook.")
    if req.gpus:
        raise JobError("With --nodes, say the GPUs of each node with --gpus-per-node, not --gpus.")
    if req.precision:
        raise JobError(
            "--precision is not offered for multi-node jobs yet: set the precision in the "
            "script (the GPUs' compute capability tells which)."
        )


def resolve_target(project: Path, target: str) -> Path:
    """``target`` inside ``project``, a regular file; refused if a link leads out."""
    if not target or "\0" in target or len(target) > 1024:
        raise JobError("Name the script (.py) or notebook (.ipynb) to run.")
    if not (target.endswith(".py") or target.endswith(".ipynb")):
        raise JobError(f"{target}: a job runs a Python script (.py) or a notebook (.ipynb).")
    root = project.resolve()
    path = (root / target).resolve()
    if root not in path.parents:
        raise JobError(f"{target} is not inside the project folder.")
    if not path.is_file():
        raise JobError(f"{target}: no such file in the project.")
    return path


def read_json(path: Path) -> dict | None:
    """A record the job's own files hold, bounded; None where it is missing or broken."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read(RECORD_MAX_BYTES + 1)
    if len(data) > RECORD_MAX_BYTES:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def write_json(path: Path, value: dict) -> None:
    """Atomic: a reader sees the old record or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, indent=1))
    os.replace(tmp, path)
