"""This hub's jobs on the cluster, for ``gpulab down`` (cancel them) and ``gpulab status``
(list them): found in squeue among the jobs of the user the hub submits as, by the
names the hub gives them, and nothing else.

- A project's job is named like its container: ``<prefix>-<user>--<project>``
  (DockerSpawner's default name_template; user and project escaped as DockerSpawner
  escapes them: lowercase letters and digits, every other byte ``-xx``).
- A multi-node job: ``<prefix>-<user>--<project>-job-<gpulab's job id>``, cut to
  jobs.JOB_NAME_MAX characters (jobs.py).

A name counts only when it reads back exactly: ``<prefix>-`` first, then user and
project that unescape to names escaping to the very same text, a project name gpulab
accepts and, for a multi-node job, a job id of gpulab's form. Jobs of another gpulab
on the same cluster (another prefix), the doctor's probe jobs (``<prefix>-doctor``)
and anything else the user runs are never taken. A multi-node job the hub's record
lists (cluster-jobs.json) counts by the name the hub gave it, so one whose name was
cut short is found too.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from escapism import unescape
from jupyterhub.slugs import is_valid_safe_slug

from gpulab_contract.jobs import JOB_ID
from gpulab_hub.cluster import ClusterError, jobs, reasons
from gpulab_hub.cluster.slurm import Job, Slurm, status_of

STOP_WAIT = 60.0  # seconds gpulab down waits for cancelled jobs to leave Slurm's active states
_ESCAPED = r"(?:[a-z0-9]|-[0-9a-f]{2})+"
_GPULAB_JOB = JOB_ID.pattern  # the contract's job ids (multinode.TrainRequest.job_id)

Escape = Callable[[str], str]


@dataclass(frozen=True)
class HubJob:
    """A job of this hub: a project's, or one of a project's multi-node jobs."""

    job: Job
    owner: str
    project: str
    multinode: str = ""  # gpulab's id of a multi-node job; "" for the project's own job

    @property
    def what(self) -> str:
        """How a user names it: "project alice/demo", "job <id> of project alice/demo"."""
        project = f"project {self.owner}/{self.project}"
        return f"job {self.multinode} of {project}" if self.multinode else project


def container_name(prefix: str, escape: Escape, owner: str, project: str) -> str:
    """A project's container name, which is its Slurm job's name too."""
    return f"{prefix}-{escape(owner)}--{escape(project.lower())}"


def _name_pattern(prefix: str) -> re.Pattern:
    return re.compile(
        re.escape(prefix)
        + rf"-(?P<user>{_ESCAPED})--(?P<project>{_ESCAPED})(?:-job-(?P<job>{_GPULAB_JOB}))?"
    )


def _read_back(escaped: str, escape: Escape) -> str | None:
    """The name ``escaped`` stands for, if escaping it gives exactly ``escaped``."""
    try:
        name = unescape(escaped, escape_char="-")
    except ValueError:  # bytes that are not UTF-8
        return None
    return name if escape(name) == escaped else None


def parse_name(name: str, prefix: str, escape: Escape) -> tuple[str, str, str] | None:
    """(owner, project, multi-node job id or "") of a job name this hub gives; else None."""
    m = _name_pattern(prefix).fullmatch(name)
    if m is None:
        return None
    owner = _read_back(m.group("user"), escape)
    project = _read_back(m.group("project"), escape)
    if not owner or not project or not is_valid_safe_slug(project):
        return None
    return owner, project, m.group("job") or ""


def select(
    queue: Iterable[Job],
    prefix: str,
    escape: Escape,
    recorded: dict[int, tuple[str, str, str]] | None = None,
) -> list[HubJob]:
    """This hub's jobs among ``queue`` (squeue's lines of the hub's user); ``recorded``:
    the hub's multi-node jobs, Slurm job id -> (owner, project, gpulab's job id)."""
    found = []
    for job in queue:
        entry = (recorded or {}).get(job.id)
        if entry is not None:
            owner, project, job_id = entry
            given = jobs.container_name(container_name(prefix, escape, owner, project), job_id)
            if job.name == given[: jobs.JOB_NAME_MAX]:
                found.append(HubJob(job, owner, project, job_id))
                continue
        parsed = parse_name(job.name, prefix, escape)
        if parsed is not None:
            found.append(HubJob(job, *parsed))
    return found


def recorded_jobs(records_dir: Path) -> dict[int, tuple[str, str, str]]:
    """The multi-node jobs the hub's record lists (none when it has no record)."""
    record = jobs.record_of(records_dir)
    if not record.path.exists():
        return {}
    with record.locked():
        entries = record._read()
    return {
        int(key): (entry["owner"], entry["project"], entry["job"])
        for key, entry in entries.items()
        if all(isinstance(entry.get(k), str) for k in ("owner", "project", "job"))
    }


def find(
    slurm: Slurm, prefix: str, escape: Escape, uid: int, records_dir: Path
) -> list[HubJob]:
    """Blocking: this hub's jobs in Slurm's queue (ClusterError when Slurm does not answer)."""
    return select(slurm.queue(user=uid), prefix, escape, recorded_jobs(records_dir))


def describe(found: HubJob, queue: list[Job]) -> str:
    """A job's state in a user's words ("running on node gpu-02", "waiting for a GPU: next
    in line"); ``queue``: every user's jobs, for the jobs ahead of a waiting one."""
    return status_of(found.job, queue).words


@dataclass(frozen=True)
class Outcome:
    """What became of one job gpulab down cancelled."""

    found: HubJob
    error: str = ""  # scancel's refusal, the job still there
    state: str = ""  # Slurm's state when the wait ran out ("" once it ended)


def stop(
    slurm: Slurm,
    found: list[HubJob],
    uid: int,
    timeout: float = STOP_WAIT,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> list[Outcome]:
    """Blocking: scancel each job, then wait (bounded) until none is in an active state
    (a job stays COMPLETING until the Epilog has removed its containers). A job that
    ended meanwhile is fine; ClusterError only when squeue stops answering."""
    refused = {}
    for f in found:
        if f.job.state == "COMPLETING":  # ending already: scancel would be refused
            continue
        try:
            slurm.cancel(f.job.id)
        except ClusterError as e:
            refused[f.job.id] = str(e)
    ids = {f.job.id for f in found}
    deadline = clock() + timeout
    while True:
        active = {j.id: j.state for j in slurm.queue(user=uid)
                  if j.id in ids and j.state in reasons.ACTIVE}  # fmt: skip
        # done: all ended, time is up, or only refused jobs are left (nothing ends them)
        if not active.keys() - refused.keys() or clock() >= deadline:
            break
        sleep(0.25)
    outcomes = []
    for f in found:
        if f.job.id not in active:
            outcomes.append(Outcome(f))
        elif f.job.id in refused:
            outcomes.append(Outcome(f, error=refused[f.job.id]))
        else:
            outcomes.append(Outcome(f, state=active[f.job.id]))
    return outcomes
