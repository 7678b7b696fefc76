"""A small client of Slurm's commands: sbatch, squeue, scancel, sinfo.

Each command runs with an argument list and an explicit environment (SLURM_CONF
and PATH only: a spawner's filtered environment has neither, and the hub's own
secrets must not reach Slurm). Output is read from fixed ``--format`` strings and
parsed strictly: a line that does not fit is an error, never a guess. Slurm 22.05
(Debian 12) is the oldest this is written for; its ``squeue --json`` needs the
OpenAPI plugins, so gpulab does not rely on it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from gpulab_hub.cluster import ClusterError, reasons, slurm_name

SEP = "|"
# squeue: job id, state, reason, partition, priority, TRES per node, nodes, name (last:
# the only field that could hold the separator).
SQUEUE_FORMAT = SEP.join(["%i", "%T", "%r", "%P", "%Q", "%b", "%N", "%j"])
# sinfo -N: node, state, GRES, address (NodeAddr), reason (last: free text).
SINFO_FORMAT = SEP.join(["%N", "%T", "%G", "%o", "%E"])
_JOB_ID = re.compile(r"[0-9]{1,12}")
_PARSABLE = re.compile(r"([0-9]{1,12})(;[A-Za-z0-9_-]+)?")
_NODE_STATE = re.compile(r"([a-z_]+)([*~#!%$@^+-]?)")
_NODELIST = re.compile(r"[A-Za-z0-9_,\[\]-]*")
_SIGNAL = re.compile(r"[A-Z0-9]{1,8}")
_NODE_ADDR = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:-]{0,252}")
# One GRES of sinfo's %G: "gpu:h200:2", "gpu:2", "gpu:a100:4(S:0-1)".
_GRES_GPU = re.compile(r"gpu(?::([A-Za-z0-9_.-]+))?:([0-9]{1,4})(\([^)]*\))?")
_STATES = set(reasons.ACTIVE) | set(reasons.ENDED)
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# sbatch's refusals, in a user's words (the first match wins).
_SUBMIT_ERRORS = (
    (
        "Requested node configuration is not available",
        "no node of the cluster has what this project asks for (its GPUs, memory or CPUs)",
    ),
    ("Invalid partition name", "the cluster has no such partition"),
    ("Invalid generic resource", "the cluster has no such GPU type"),
    ("Memory specification can not be satisfied", "no node has that much memory"),
    ("Unable to contact slurm controller", "the cluster's controller does not answer"),
)


@dataclass(frozen=True)
class Job:
    """One line of squeue."""

    id: int
    state: str
    reason: str
    partition: str
    priority: int
    tres_per_node: str
    nodes: str
    name: str

    @property
    def wants_gpu(self) -> bool:
        return any(part.split(":")[:2] == ["gres", "gpu"] for part in self.tres_per_node.split(","))


@dataclass(frozen=True)
class Node:
    """One line of ``sinfo -N``."""

    name: str
    state: str  # "idle", "mixed", "allocated", "down", "drained", ...
    flag: str  # "*" not responding, "~" powered off, ... ("" for none)
    gres: str
    reason: str
    address: str = ""  # NodeAddr: where the head reaches the node (an IP or a host name)

    def gpus(self, gpu_type: str = "") -> int:
        """GPUs this node has in its GRES (of ``gpu_type``; "" for any type)."""
        return gpu_count(self.gres, gpu_type)

    @property
    def usable(self) -> bool:
        """Up and taking jobs (idle, mixed or allocated; not down, drained, failing)."""
        return self.state in ("idle", "mixed", "allocated", "completing") and self.flag in ("", "+")


@dataclass(frozen=True)
class JobStatus:
    """A job as gpulab shows it: Slurm's state and reason, and the words for users."""

    id: int
    state: str
    reason: str
    ahead: int
    words: str
    nodes: str = ""

    @property
    def ended(self) -> bool:
        return self.state in reasons.ENDED


def parse_squeue(text: str) -> list[Job]:
    jobs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split(SEP, 7)
        if len(fields) != 8:
            raise ClusterError(f"squeue printed a line gpulab cannot read: {line!r}")
        jid, state, reason, partition, prio, tres, nodes, name = fields
        if (
            _JOB_ID.fullmatch(jid) is None
            or state not in _STATES
            or not prio.isdigit()
            or _NODELIST.fullmatch(nodes) is None
        ):
            raise ClusterError(f"squeue printed a line gpulab cannot read: {line!r}")
        jobs.append(Job(int(jid), state, reason, partition, int(prio), tres, nodes, name))
    return jobs


def parse_sinfo(text: str) -> list[Node]:
    nodes: dict[str, Node] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split(SEP, 4)
        if len(fields) != 5:
            raise ClusterError(f"sinfo printed a line gpulab cannot read: {line!r}")
        name, state, gres, address, reason = fields
        m = _NODE_STATE.fullmatch(state)
        if m is None or (address and _NODE_ADDR.fullmatch(address) is None):
            raise ClusterError(f"sinfo printed a line gpulab cannot read: {line!r}")
        slurm_name(name, "Node")
        nodes.setdefault(name, Node(name, m.group(1), m.group(2), gres, reason, address))
    return list(nodes.values())


def gpu_count(gres: str, gpu_type: str = "") -> int:
    """GPUs in a GRES string as sinfo prints it ("gpu:h200:2,gpu:a100:1(S:0)"), of
    ``gpu_type`` ("" for any). Parts that are not GPUs are skipped; a GPU part that
    does not parse counts nothing (never a guess)."""
    total = 0
    for m in re.finditer(r"(?:^|,)(gpu[^,(]*(?:\([^)]*\))?)", gres):
        part = _GRES_GPU.fullmatch(m.group(1))
        if part and (not gpu_type or part.group(1) == gpu_type):
            total += int(part.group(2))
    return total


def parse_submitted(text: str) -> int:
    """The job id ``sbatch --parsable`` printed ("123" or "123;cluster")."""
    m = _PARSABLE.fullmatch(text.strip())
    if m is None:
        raise ClusterError(f"sbatch printed {text.strip()!r}, not a job id")
    return int(m.group(1))


def jobs_ahead(job: Job, queue: list[Job]) -> int:
    """Pending jobs of the same partition that Slurm considers before ``job``
    (higher priority, or the same priority and submitted earlier)."""
    return sum(
        1
        for other in queue
        if other.state == "PENDING"
        and other.partition == job.partition
        and other.id != job.id
        and (other.priority, -other.id) > (job.priority, -job.id)
    )


def status_of(job: Job, queue: list[Job]) -> JobStatus:
    ahead = jobs_ahead(job, queue) if job.state == "PENDING" else 0
    words = reasons.describe(
        job.state, job.reason, job.wants_gpu, ahead, node=job.nodes, partition=job.partition
    )
    return JobStatus(job.id, job.state, job.reason, ahead, words, job.nodes)


def submit_error(stderr: str) -> str:
    """sbatch's refusal in a user's words, with Slurm's own last line."""
    last = stderr.strip().splitlines()[-1] if stderr.strip() else "no message"
    for needle, words in _SUBMIT_ERRORS:
        if needle in stderr:
            return f"The cluster refused the project's job: {words} (Slurm: {last})"
    return f"The cluster refused the project's job (Slurm: {last})"


Runner = Callable[..., subprocess.CompletedProcess]


class Slurm:
    """Slurm's commands for one cluster (its slurm.conf)."""

    def __init__(
        self,
        conf: str = "",
        path: str = DEFAULT_PATH,
        timeout: float = 30,
        run: Runner = subprocess.run,
    ):
        self.conf = conf
        self.path = path
        self.timeout = timeout
        self._run = run

    def environ(self) -> dict[str, str]:
        env = {"PATH": self.path, "LC_ALL": "C.UTF-8"}
        if self.conf:
            env["SLURM_CONF"] = self.conf
        return env

    def command(self, name: str) -> str:
        found = shutil.which(name, path=self.path)
        if found is None:
            raise ClusterError(f"Slurm's {name} is not installed here (searched {self.path})")
        return found

    def call(self, name: str, *args: str, stdin: str | None = None):
        argv = [self.command(name), *args]
        try:
            return self._run(
                argv,
                input=stdin,
                env=self.environ(),
                capture_output=True,
                text=True,
                timeout=self.timeout,
            )
        except subprocess.TimeoutExpired as e:
            raise ClusterError(
                f"Slurm's {name} did not answer in {self.timeout:g} s (is slurmctld up?)"
            ) from e

    def _checked(self, name: str, *args: str, stdin: str | None = None) -> str:
        done = self.call(name, *args, stdin=stdin)
        if done.returncode != 0:
            last = done.stderr.strip().splitlines()[-1:] or ["no message"]
            raise ClusterError(f"Slurm's {name} failed: {last[0]}")
        return done.stdout

    def submit(self, script: str, options: list[str]) -> int:
        """Submit a batch script (on sbatch's standard input); its job id."""
        done = self.call("sbatch", *options, stdin=script)
        if done.returncode != 0:
            raise ClusterError(submit_error(done.stderr))
        return parse_submitted(done.stdout)

    def cancel(self, job_id: int, signal: str = "", full: bool = False) -> None:
        args = []
        if signal:
            if _SIGNAL.fullmatch(signal) is None:
                raise ClusterError(f"Signal {signal!r} is not one gpulab sends")
            args.append(f"--signal={signal}")
        if full:
            args.append("--full")
        self._checked("scancel", *args, str(int(job_id)))

    def queue(self, partition: str = "", user: int | None = None) -> list[Job]:
        """squeue's jobs that have not ended (of ``partition``, of the user id ``user``)."""
        args = ["--noheader", f"--format={SQUEUE_FORMAT}"]
        if partition:
            args.append(f"--partition={slurm_name(partition, 'Partition')}")
        if user is not None:
            args.append(f"--user={int(user)}")
        return parse_squeue(self._checked("squeue", *args))

    def job(self, job_id: int) -> Job | None:
        """The job as squeue knows it (all states), or None once Slurm forgot it."""
        done = self.call(
            "squeue",
            "--noheader",
            "--states=all",
            f"--format={SQUEUE_FORMAT}",
            f"--jobs={int(job_id)}",
        )
        if done.returncode != 0:
            if "Invalid job id" in done.stderr:
                return None
            raise ClusterError(f"Slurm's squeue failed: {done.stderr.strip()}")
        jobs = [j for j in parse_squeue(done.stdout) if j.id == int(job_id)]
        return jobs[0] if jobs else None

    def status(self, job_id: int) -> JobStatus | None:
        """The job's state with its reason in a user's words (None once forgotten)."""
        job = self.job(job_id)
        if job is None:
            return None
        queue = self.queue(job.partition) if job.state == "PENDING" else []
        return status_of(job, queue)

    def nodes(self) -> list[Node]:
        return parse_sinfo(self._checked("sinfo", "--noheader", "-N", f"--format={SINFO_FORMAT}"))
