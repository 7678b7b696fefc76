"""The job runner's interface, and what this container offers a job."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Protocol

from gpulab_jupyter.jobs.launch import Machine
from gpulab_jupyter.jobs.model import JobRecord, JobRequest


class Engine(Protocol):
    """Where jobs run: this container (``LocalEngine``), or on gpulab's Slurm cluster
    also several nodes (``ClusterEngine``); both implement these five calls."""

    def start(self, req: JobRequest, extra_env: Mapping[str, str] | None = None) -> JobRecord:
        """``extra_env``: added to the job's environment (the starter's secrets)."""

    def status(self, job_id: str) -> JobRecord: ...

    def logs(self, job_id: str, tail_bytes: int = 65536) -> str: ...

    def stop(self, job_id: str) -> JobRecord: ...

    def list(self) -> list[JobRecord]: ...


def this_machine() -> Machine:
    """This container's GPUs (every GPU NVML lists here, through gpulab_jupyter.nvml) and
    the CPUs it may use; without GPUs, why (gpulab_jupyter.diagnosis)."""
    from gpulab_jupyter import nvml

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        with nvml.opened() as lib:
            caps = tuple(g.capability for g in nvml.gpus(lib))
    except nvml.NVMLError:
        caps = ()
    why = None
    if not caps:
        from gpulab_jupyter.diagnosis import why_no_gpu

        why = why_no_gpu()
    return Machine(capabilities=caps, cpus=cpus or 1, why_no_gpu=why)
