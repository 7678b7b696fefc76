"""From a submitted job to a reachable project: the queue's words while the job waits,
the script's progress once it runs, and the address the hub connects to.

:func:`wait_ready` asks Slurm (squeue, through ``Slurm.status``) and reads the job's
output (joblog.py) about once a second. While the job is PENDING, each change of
Slurm's reason, in users' words ("waiting for a GPU: 1 job ahead"), becomes a
progress event kept in view on the spawn page. Once the job runs, the script's
progress lines follow, then its ``gpulab-ready`` line, whose address must be the one
the hub gave the node squeue says the job runs on. A job that ends first, or waits
longer than the queue timeout (it is cancelled then), fails with the script's own
words. Blocking calls go through ``run`` (the spawner's worker threads).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gpulab_hub.cluster import ClusterError
from gpulab_hub.cluster.joblog import JobLog, Ready
from gpulab_hub.cluster.slurm import JobStatus, Slurm

WAITING = ("PENDING",)
STARTED = ("CONFIGURING", "RUNNING")


class JobFailed(ClusterError):
    """The job ended, or was cancelled, before the project was ready."""

    def __init__(self, message: str, lines: tuple[str, ...] = ()):
        super().__init__(message)
        self.lines = lines  # the script's lines quoting the container's last output


@dataclass
class Watch:
    """What one start saw: for the spawn page, the figures and the error."""

    job_id: int
    queued_s: float | None = None  # seconds from submission to RUNNING
    node: str = ""
    words: str = ""
    failures: list[str] = field(default_factory=list)


def _minutes(seconds: float) -> str:
    m = round(seconds / 60)
    return f"{m} minute" if m == 1 else f"{m} minutes"


def failure_message(project: str, watch: Watch, status: JobStatus | None) -> JobFailed:
    """Why the start failed, in the script's words where it left some."""
    if status is None:
        what = "is gone from the cluster's queue"
    else:
        what = status.words
    said = [f.strip() for f in watch.failures if not f.startswith("  ")]
    quoted = tuple(f[2:] for f in watch.failures if f.startswith("  "))
    message = f"Project {project}'s job on the cluster (Slurm job {watch.job_id}) {what} "
    message += "before the project was ready"
    if said:
        message += ": " + " ".join(said)
    else:
        message += (
            ". Start it again; if it fails again, ask the administrator to look at the "
            "job's output (docs/cluster.md)."
        )
    return JobFailed(message, quoted)


async def wait_ready(
    slurm: Slurm,
    job_id: int,
    log: JobLog,
    addresses: dict[str, str],
    *,
    project: str,
    emit: Callable[..., None],
    run: Callable[..., Awaitable],
    queue_timeout: float,
    every: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable] = asyncio.sleep,
    watch: Watch | None = None,
) -> Ready:
    """Until the job's container is published on its node: its address and port."""
    watch = watch or Watch(job_id)
    submitted = clock()
    while True:
        status = await run(slurm.status, job_id)
        started = status is not None and status.state in STARTED
        ended = status is None or not (started or status.state in WAITING)
        said = []
        if ended:
            said = await run(log.read_all)  # it ended: its last words are all written
        elif started:
            said = await run(log.read)
        if started and watch.queued_s is None:
            watch.queued_s = clock() - submitted
            watch.node = status.nodes
            emit(
                85,
                f"Running on node {status.nodes} (after {watch.queued_s:.0f} s in the "
                "cluster's queue)",
                True,
            )
        ready = None
        for line in said:
            if line.kind == "progress":
                emit(90, line.text)
            elif line.kind == "failure":
                watch.failures.append(line.text)
            elif line.kind == "ready" and ready is None:
                ready = line.ready
        if ready is not None and started:
            want = addresses.get(status.nodes)
            if ready.address != want:
                raise ClusterError(
                    f"Project {project}'s job said it listens on {ready.address}, which is "
                    f"not the cluster address of node {status.nodes} ({want}), where Slurm "
                    "runs it; the job was stopped. Ask the administrator (docs/cluster.md)."
                )
            return ready
        if ended:
            raise failure_message(project, watch, status)
        if status.state in WAITING:
            if status.words != watch.words:
                watch.words = status.words
                emit(82, f"In the cluster's queue (Slurm job {job_id}): {status.words}", True)
            waited = clock() - submitted
            if waited > queue_timeout:
                raise JobFailed(
                    f"The cluster had no room for project {project} within "
                    f"{_minutes(queue_timeout)} (Slurm job {job_id}: {status.words}), so its "
                    "job was cancelled. Start it again later, or with fewer GPUs."
                )
        await sleep(every)
