"""The job runner's interface, and what this container offers a job."""

from __future__ import annotations

import logging
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
    """This container's GPUs (NVML, through nvitop: only the GPUs given to the
    container) and the CPUs it may use; without GPUs, why (gpulab_jupyter.diagnosis)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    # Where there is no driver, nvitop's NVML module logs a "FATAL ERROR" block (through
    # logging's last-resort handler: onto the kernel's stderr, into the notebook). A host
    # without GPU is no error here, and the job's own words say what to do: it is muted.
    muted = [logging.getLogger(name) for name in ("nvitop", "nvitop.api.libnvml")]
    was = [logger.disabled for logger in muted]
    for logger in muted:
        logger.disabled = True
    try:
        from nvitop import Device, libnvml

        try:
            found = [d.cuda_compute_capability() for d in Device.all()]
        except libnvml.NVMLError:
            found = []
    except ImportError:
        found = []
    finally:
        for logger, disabled in zip(muted, was, strict=True):
            logger.disabled = disabled
    caps = tuple(
        (int(c[0]), int(c[1]))
        for c in found
        if isinstance(c, tuple) and len(c) == 2 and all(isinstance(x, int) for x in c)
    )
    why = None
    if not caps:
        from gpulab_jupyter.diagnosis import why_no_gpu

        why = why_no_gpu()
    return Machine(capabilities=caps, cpus=cpus or 1, why_no_gpu=why)
