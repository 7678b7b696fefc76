"""Multi-node jobs on the hub's side: submitting one (the job network addresses it gets,
the batch script, sbatch), what each project's jobs are doing, stopping one.

The hub keeps one record of the multi-node jobs it submitted (``cluster-jobs.json`` in
its records folder, a LockedRecord: a file lock across processes, atomic writes):
per Slurm job id, the project, gpulab's job id, what was asked, the job network
addresses, and Slurm's last state. An address is taken while a job that holds it has
not ended; the hub asks Slurm about every job it has not seen end before it assigns
addresses, so an ended job's addresses are free for the next one (a job stays
"COMPLETING" until the Epilog removed its containers: its addresses stay taken until
then). Everything here blocks (Slurm's commands, the file lock): the API runs it on a
worker thread.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpulab_contract import environment
from gpulab_hub import jsonfile, stateversion
from gpulab_hub.cluster import ClusterError, batch
from gpulab_hub.cluster.batch import FAILURE, PROGRESS, NodeEngine, SlurmGpus
from gpulab_hub.cluster.multinode import (
    JobNetwork,
    Limits,
    MultiNodeJob,
    TrainRequest,
    check_request,
    job_env,
    render_script,
    sbatch_args,
)
from gpulab_hub.cluster.slurm import Slurm
from gpulab_hub.projects import objects

RECORD = "cluster-jobs.json"
KEEP_ENDED_PER_PROJECT = 200
OUTPUT_TAIL_BYTES = 16384
JOB_NAME_MAX = 128  # the longest --job-name batch.sbatch_args takes
_LABEL = re.compile(r"^\s*[0-9]{1,4}: ")  # srun --label's "<task>: "


@dataclass(frozen=True)
class Site:
    """What the hub knows about the cluster (ProjectSlurmSpawner's settings)."""

    cluster: str
    slurm: Slurm
    network: JobNetwork
    limits: Limits
    log_dir: Path  # the jobs' output files (hub-owned, on storage the nodes mount)
    mem_mb: int
    cpus: int
    gpus: SlurmGpus = field(default_factory=SlurmGpus)  # type, nodes, isolation; no count
    engine: NodeEngine = field(default_factory=NodeEngine)
    partition: str = ""
    time_limit: str = ""
    master_port: int = 29500
    docker: str = "docker"


@dataclass(frozen=True)
class ProjectRef:
    """The project a job belongs to, as its spawner knows it."""

    owner: str
    name: str
    container: objects.ContainerInputs  # the project container's settings
    image: str  # the project's image by digest, as the nodes pull it


class JobsRecord(jsonfile.LockedRecord):
    """The hub's record of the multi-node jobs it submitted, by Slurm job id."""

    kind = stateversion.KINDS["cluster-jobs"]
    section = "jobs"
    what = "The record of multi-node jobs"
    on_damage = "it starts empty (jobs still running keep running; their addresses count as free)"

    def _parse(self, section):
        section = super()._parse(section)
        for key, entry in section.items():
            if not key.isdigit() or not isinstance(entry.get("addresses"), list):
                raise ValueError(f"entry {key!r} is not a job")
        return section

    def move_project(self, owner: str, old: str, new: str) -> bool:
        """The jobs of ``owner``'s project ``old`` as ``new``'s (a rename); any moved?
        Jobs recorded under ``new`` (there should be none) are forgotten first."""
        if not self.path.exists():
            return False
        with self.locked():
            jobs = self._read()
            kept = {k: e for k, e in jobs.items() if (e["owner"], e["project"]) != (owner, new)}
            moved = False
            for entry in kept.values():
                if (entry["owner"], entry["project"]) == (owner, old):
                    entry["project"] = new
                    moved = True
            if moved or len(kept) != len(jobs):
                self._write(kept)
            return moved

    def holds(self, owner: str, project: str) -> bool:
        """Whether a job of ``owner``'s ``project`` is recorded."""
        if not self.path.exists():
            return False
        with self.locked():
            entries = self._read().values()
            return any((e["owner"], e["project"]) == (owner, project) for e in entries)

    def forget(self, owner: str, project: str | None = None) -> int:
        """Forget the jobs of ``owner``'s project (every project: None); how many. A job
        still running runs on; a new project of the same name never sees it."""
        if not self.path.exists():
            return 0
        with self.locked():
            jobs = self._read()
            kept = {
                k: e
                for k, e in jobs.items()
                if e["owner"] != owner or (project is not None and e["project"] != project)
            }
            if len(kept) != len(jobs):
                self._write(kept)
            return len(jobs) - len(kept)


def record_of(records_dir: Path) -> JobsRecord:
    return JobsRecord(Path(records_dir) / RECORD)


def container_name(project_container: str, job_id: str) -> str:
    """The container name of a project's multi-node job (``<project's container>-job-<id>``);
    its Slurm job is named the same, cut to JOB_NAME_MAX characters."""
    return f"{project_container}-job-{job_id}"


def job_container(site: Site, project: ProjectRef, req: TrainRequest) -> objects.ContainerInputs:
    """The job's container: the project's, with the job's name, image, environment and
    limits, on the job network (no GPUs named: Slurm decides them on each node)."""
    base = project.container
    env = job_env(req, site.cpus, environment.build(project=project.name, owner=project.owner))
    return replace(
        base,
        name=container_name(base.name, req.job_id),
        image=project.image,
        command=[],
        env=env,
        network=site.network.name,
        gpus=objects.GpuAssignment(),
        mem_limit=site.mem_mb * 2**20,
        cpu_limit=float(site.cpus),
    )


def _refresh(slurm: Slurm, jobs: dict) -> None:
    """Slurm's state of every job not yet seen ending (the caller holds the record)."""
    now = time.time()
    for key, entry in jobs.items():
        if entry.get("ended"):
            continue
        status = slurm.status(int(key))
        if status is None:  # Slurm forgot it: it ended long enough ago
            entry.update(ended=now, words=entry.get("words") or "ended")
            continue
        entry.update(state=status.state, reason=status.reason, words=status.words)
        entry["nodelist"] = status.nodes or entry.get("nodelist", "")
        if status.ended:
            entry["ended"] = now


def output_file(log_dir: Path, slurm_id: int | str) -> Path:
    """A job's output file (sbatch's ``--output``; the batch script's own lines)."""
    return Path(log_dir) / f"job-{int(slurm_id)}.out"


def _prune(jobs: dict, owner: str, project: str, log_dir: Path) -> None:
    """The project's oldest ended jobs beyond KEEP_ENDED_PER_PROJECT, and their output
    files, go."""
    mine = [k for k, e in jobs.items() if (e["owner"], e["project"]) == (owner, project)]
    ended = sorted((k for k in mine if jobs[k].get("ended")), key=lambda k: jobs[k]["ended"])
    for key in ended[:-KEEP_ENDED_PER_PROJECT]:
        del jobs[key]
        output_file(log_dir, key).unlink(missing_ok=True)


def free_addresses(network: JobNetwork, jobs: dict, count: int) -> tuple[str, ...]:
    """``count`` addresses no job that has not ended holds, or ClusterError."""
    taken = {a for e in jobs.values() if not e.get("ended") for a in e["addresses"]}
    free = [a for a in network.assignable() if a not in taken]
    if len(free) < count:
        raise ClusterError(
            f"The cluster's job network has {len(free)} free addresses and this job needs "
            f"{count}: other multi-node jobs hold them. Try again when one ends (or ask the "
            "administrator to widen job_network_range)."
        )
    return tuple(free[:count])


def new_entry(
    owner: str, project: str, req: TrainRequest, addresses: tuple[str, ...], submitted: float
) -> dict:
    """The record of a job Slurm just took (pending, nothing heard from it yet)."""
    return {
        "owner": owner,
        "project": project,
        "job": req.job_id,
        "script": req.script,
        "args": list(req.args),
        "nodes": req.nodes,
        "gpus_per_node": req.gpus_per_node,
        "addresses": list(addresses),
        "submitted": submitted,
        "state": "PENDING",
        "reason": "",
        "words": "submitted",
        "nodelist": "",
        "ended": None,
        "stop_requested": False,
    }


def submit(site: Site, record: JobsRecord, project: ProjectRef, req: TrainRequest) -> dict:
    """Submit ``req`` as a multi-node Slurm job; the job as ``view`` shows it."""
    req = check_request(req, site.limits)
    site.log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    gpus = replace(site.gpus, count=req.gpus_per_node)
    container = job_container(site, project, req)
    with record.locked():
        jobs = record._read()
        if any(
            (e["owner"], e["project"], e["job"]) == (project.owner, project.name, req.job_id)
            for e in jobs.values()
        ):
            raise ClusterError(f"The project already has a job {req.job_id}.")
        _refresh(site.slurm, jobs)
        job = MultiNodeJob(
            cluster=site.cluster,
            request=req,
            container=container,
            network=site.network,
            addresses=free_addresses(site.network, jobs, req.nodes),
            gpus=gpus,
            engine=site.engine,
            docker=site.docker,
            master_port=site.master_port,
        )
        request = batch.JobRequest(
            name=container.name[:JOB_NAME_MAX],
            mem_mb=site.mem_mb,
            cpus=site.cpus,
            gpus=req.gpus_per_node,
            gpu_type=site.gpus.type if req.gpus_per_node else "",
            partition=site.partition,
            time_limit=site.time_limit,
            output=str(site.log_dir / "job-%j.out"),  # output_file's name
        )
        slurm_id = site.slurm.submit(render_script(job), sbatch_args(job, request))
        jobs[str(slurm_id)] = new_entry(
            project.owner, project.name, req, job.addresses, time.time()
        )
        _prune(jobs, project.owner, project.name, site.log_dir)
        record._write(jobs)
        entry = jobs[str(slurm_id)]
    return view(site, slurm_id, entry)


def _find(jobs: dict, owner: str, project: str, job_id: str) -> tuple[str, dict]:
    for key, entry in jobs.items():
        if (entry["owner"], entry["project"], entry["job"]) == (owner, project, job_id):
            return key, entry
    raise LookupError(job_id)


def project_jobs(site: Site, record: JobsRecord, owner: str, project: str) -> list[dict]:
    """The project's multi-node jobs, newest first, Slurm's state brought up to date."""
    with record.locked():
        jobs = record._read()
        mine = {k: e for k, e in jobs.items() if (e["owner"], e["project"]) == (owner, project)}
        if any(not e.get("ended") for e in mine.values()):
            _refresh(site.slurm, mine)
            record._write(jobs)  # mine's entries are jobs' own
    ordered = sorted(mine.items(), key=lambda kv: kv[1]["submitted"], reverse=True)
    return [view(site, int(k), e) for k, e in ordered]


def one_job(site: Site, record: JobsRecord, owner: str, project: str, job_id: str) -> dict:
    """One job (LookupError if the project has none of that id)."""
    with record.locked():
        jobs = record._read()
        key, entry = _find(jobs, owner, project, job_id)
        if not entry.get("ended"):
            _refresh(site.slurm, {key: entry})
            record._write(jobs)
    return view(site, int(key), entry)


def stop(site: Site, record: JobsRecord, owner: str, project: str, job_id: str) -> dict:
    """scancel the job (its tasks' traps remove the containers; the Epilog if killed)."""
    with record.locked():
        jobs = record._read()
        key, entry = _find(jobs, owner, project, job_id)
        if not entry.get("ended"):
            site.slurm.cancel(int(key))
            entry["stop_requested"] = True
            _refresh(site.slurm, {key: entry})
            record._write(jobs)
    return view(site, int(key), entry)


def output_lines(path: Path) -> tuple[list[str], str]:
    """The failure lines (``gpulab: ...``) and the last progress words of a job's
    output file: read bounded, never through a link; srun's task labels removed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return [], ""
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(fd).st_size
        f.seek(max(0, size - OUTPUT_TAIL_BYTES))
        text = f.read(OUTPUT_TAIL_BYTES).decode("utf-8", "replace")
    failures, progress = [], ""
    for line in text.splitlines():
        line = _LABEL.sub("", line)[:300]
        if line.startswith(PROGRESS):
            progress = line[len(PROGRESS) :].strip()
        elif line.startswith(FAILURE + " "):
            failures.append(line[len(FAILURE) :].strip())
    return failures[-12:], progress


def view(site: Site, slurm_id: int, entry: dict) -> dict:
    """A job as the API answers it."""
    failures, progress = output_lines(output_file(site.log_dir, slurm_id))
    return {
        "id": entry["job"],
        "slurm_job": slurm_id,
        "script": entry["script"],
        "args": entry["args"],
        "nodes": entry["nodes"],
        "gpus_per_node": entry["gpus_per_node"],
        "addresses": entry["addresses"],
        "submitted": entry["submitted"],
        "state": entry["state"],
        "reason": entry["reason"],
        "words": entry["words"],
        "nodelist": entry["nodelist"],
        "ended": entry["ended"],
        "stop_requested": entry["stop_requested"],
        "progress": progress,
        "failure": failures,
    }
