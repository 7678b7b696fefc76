"""A job's request and record, and the checks on everything a user hands in.

A job runs one of three things: a Python script (``train.py --epochs 3``), a notebook
(``report.ipynb``), or any command, as tmux or nohup would (``-- bash train.sh``,
``-- accelerate launch train.py``, ``-- python -m pkg.train``). A command is an
argument list, run without a shell (``bash -c '...'`` where the user wants one).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import time
import unicodedata
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Job ids: the contract's, which the hub matches too (new_id makes them).
from gpulab_contract.files import write_atomic
from gpulab_contract.jobs import JOB_ID, new_id  # noqa: F401

# A job's name: what the user called it (shown in lists), plain and short.
JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._ -]{0,63}")
PRECISIONS = ("auto", "bf16", "fp16", "fp32", "")
STATES = ("starting", "running", "succeeded", "failed", "stopped", "lost")
FINISHED = ("succeeded", "failed", "stopped", "lost")
MAX_ARGS = 256
MAX_ARG_LEN = 4096
# All the words of a command or a script's arguments together: a job's record keeps
# them twice (request and argv), JSON-escaped, within RECORD_MAX_BYTES.
MAX_COMMAND_CHARS = 16384
# The program of a command: a name found on PATH (``bash``, ``accelerate``), or a path
# (``./train.sh``, ``scripts/run.sh``, ``/opt/conda/bin/python``); never an option.
PROGRAM = re.compile(
    r"(?:\.{1,2}/|/)?(?:[A-Za-z0-9_+@][A-Za-z0-9._+@-]*/)*[A-Za-z0-9_+@][A-Za-z0-9._+@-]*"
)
# Characters a word of a command may not hold: they would make what lists and the Jobs
# panel show differ from what runs (control characters: newline, tab, escape, ...;
# bidirectional overrides and other invisible format characters).
HIDDEN_CATEGORIES = ("Cc", "Cf", "Cs", "Co", "Cn")
CONTROL_NAMES = {"\0": "NUL", "\t": "TAB", "\n": "LINE FEED", "\r": "CARRIAGE RETURN",
                 "\x1b": "ESCAPE"}  # fmt: skip
MAX_NODES = 99
RECORD_MAX_BYTES = 256 * 1024


class JobError(Exception):
    """What went wrong, in the user's words."""


@dataclass(frozen=True)
class JobRequest:
    """What the user asked for: a script (with arguments), a notebook, or a command."""

    target: str = ""  # a .py or .ipynb path, relative to the project folder
    args: tuple[str, ...] = ()
    gpus: str = ""  # "" (the project's GPUs, one process), "all" (torchrun), or a count
    precision: str = ""
    name: str = ""
    nodes: int = 0  # 0: this container; N: a multi-node job on the cluster (torchrun)
    gpus_per_node: int = 0  # GPUs on each node of a multi-node job (0: CPUs only)
    # Any command, an argument list run as it is (no shell); then no target and no args.
    command: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        if self.command:
            return "command"
        return "notebook" if self.target.endswith(".ipynb") else "script"

    @classmethod
    def of(cls, request: dict) -> JobRequest:
        """The request a job record keeps (``JobRecord.request``), for a re-run."""
        known = {f.name for f in dataclasses.fields(cls)}
        req = {k: v for k, v in request.items() if k in known}
        req["args"] = tuple(req.get("args") or ())
        req["command"] = tuple(req.get("command") or ())
        return cls(**req)


def command_text(request: dict) -> str:
    """What a job runs, as a shell would read it (``bash train.sh``, ``train.py --epochs
    3``), quoted so that it reads exactly: the COMMAND of ``%gpu_job list`` and
    ``gpulab-job list``, and what the Jobs panel shows."""
    command = request.get("command") or ()
    if command:
        return shlex.join(str(w) for w in command)
    words = [str(request.get("target") or ""), *(str(a) for a in request.get("args") or ())]
    return shlex.join(words)


def command_line(request: dict) -> str:
    """What the user asked to run, as they would type it after ``gpulab-job run``
    (``-- bash train.sh``, ``train.py --epochs 3``): the API's ``command_line``, and what
    a message that says which command to type shows."""
    text = command_text(request)
    return f"-- {text}" if request.get("command") else text


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
    check_words(req.args, "arguments")
    if req.command:
        if req.target or req.args:
            raise JobError(
                "Give a script (train.py --epochs 3) or a command after -- "
                "(-- bash train.sh), not both."
            )
        check_command(req.command, project)
        check_nodes(req)
        return req
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
    if req.kind != "script":
        raise JobError(
            f"A multi-node job runs a Python script with torchrun, not a {req.kind}: "
            "gpulab-job run --nodes 2 --gpus-per-node 4 train.py."
        )
    if req.gpus:
        raise JobError("With --nodes, say the GPUs of each node with --gpus-per-node, not --gpus.")
    if req.precision:
        raise JobError(
            "--precision is not offered for multi-node jobs yet: set the precision in the "
            "script (the GPUs' compute capability tells which)."
        )


def check_words(words, what: str) -> None:
    """A command's words or a script's arguments: strings, bounded in count and length,
    each shown as it is (no NUL, control or invisible format character)."""
    if not isinstance(words, tuple) or not all(isinstance(w, str) for w in words):
        raise JobError(f"The {what} must be a list of words (strings).")
    if len(words) > MAX_ARGS:
        raise JobError(f"Too many {what}: at most {MAX_ARGS} words.")
    if any(len(w) > MAX_ARG_LEN for w in words):
        raise JobError(f"One of the {what} is too long: at most {MAX_ARG_LEN} characters each.")
    if sum(len(w) for w in words) > MAX_COMMAND_CHARS:
        raise JobError(f"The {what} are too long: at most {MAX_COMMAND_CHARS} characters in all.")
    for word in words:
        bad = next((c for c in word if unicodedata.category(c) in HIDDEN_CATEGORIES), None)
        if bad is not None:
            raise JobError(
                f"The {what} hold a character that does not show as itself "
                f"({_char_name(bad)}), in {word!r}: write each "
                "word as plain text (for a script of several lines, run a file: -- bash run.sh)."
            )


def _char_name(c: str) -> str:
    name = CONTROL_NAMES.get(c) or unicodedata.name(c, "")
    return f"U+{ord(c):04X} {name}".strip()


def check_command(command: tuple[str, ...], project: Path) -> None:
    """A command's words (``check_words``) and its program: a name (looked for on PATH
    when it starts), an absolute path, or a path in the project."""
    check_words(command, "command's words")
    program = command[0]
    if not PROGRAM.fullmatch(program):
        raise JobError(
            f"{program!r} is not a program to run: after -- comes the program's name or "
            "path, then its arguments (-- bash train.sh, -- python -m pkg.train)."
        )
    if "/" in program and not program.startswith("/"):
        root = project.resolve()
        path = (root / program).resolve()
        if root not in path.parents:
            raise JobError(f"{program} is not inside the project folder.")
        if not path.is_file():
            raise JobError(f"{program}: no such file in the project.")
        if not os.access(path, os.X_OK):
            raise JobError(
                f"{program} is not executable: make it so (chmod +x {program}) or run it "
                f"with its interpreter (-- bash {program})."
            )


def resolve_target(project: Path, target: str) -> Path:
    """``target`` inside ``project``, a regular file; refused if a link leads out."""
    if not target or "\0" in target or len(target) > 1024:
        raise JobError(
            "Name the script (.py) or notebook (.ipynb) to run, or give a command after -- "
            "(gpulab-job run -- bash train.sh)."
        )
    if not (target.endswith(".py") or target.endswith(".ipynb")):
        raise JobError(
            f"{target}: name a Python script (.py) or a notebook (.ipynb), or put any "
            f"other command after -- (gpulab-job run -- bash {shlex.quote(target)})."
        )
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
    write_atomic(path, json.dumps(value, indent=1).encode())
