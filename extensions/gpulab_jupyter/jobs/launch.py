"""The command and environment of a job: pure functions of the request and of what
this container has (GPUs, their compute capabilities, CPUs), tested without a GPU.

Multi-GPU (``--gpus all``) is ``torchrun --standalone --nproc-per-node=<GPUs>``, as
a DDP/FSDP script written for ``torchrun`` expects: one process per GPU of this
project, rendezvous on this host, NCCL over this host's shared memory and PCIe/NVLink.
A command (``-- accelerate launch train.py``) runs as it is, once: ``--gpus`` then says
how many of the project's GPUs it sees, and the launcher it names starts its processes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gpulab_jupyter.diagnosis import NoGpu
from gpulab_jupyter.jobs.model import JobError, JobRequest, command_line


@dataclass(frozen=True)
class Machine:
    """What the job can use: this container's GPUs (compute capabilities, in CUDA's
    order) and CPUs; where it has none, why (gpulab_jupyter.diagnosis)."""

    capabilities: tuple[tuple[int, int], ...] = ()
    cpus: int = 1
    why_no_gpu: NoGpu | None = None

    @property
    def gpus(self) -> int:
        return len(self.capabilities)


def precision_for(capabilities: tuple[tuple[int, int], ...]) -> str:
    """bf16 where every GPU has it (compute capability 8.0, Ampere, and later), fp16 on
    older GPUs, fp32 without a GPU."""
    if not capabilities:
        return "fp32"
    return "bf16" if all(cc >= (8, 0) for cc in capabilities) else "fp16"


def processes(req: JobRequest, machine: Machine) -> int:
    """How many processes the job starts (one per GPU for ``--gpus all``)."""
    if req.gpus == "":
        return 1
    wanted = machine.gpus if req.gpus == "all" else int(req.gpus)
    if machine.gpus == 0:
        raise JobError(no_gpu_words(req, machine.why_no_gpu))
    if wanted > machine.gpus:
        raise JobError(
            f"--gpus {req.gpus}: this project holds {machine.gpus} GPU(s). Stop the project "
            "and start it again asking for more, or ask for fewer."
        )
    return wanted


def no_gpu_words(req: JobRequest, why: NoGpu | None) -> str:
    """Why ``--gpus`` cannot be met here, and how to run the job on the CPU instead; a
    restart with GPUs is offered only where the host has GPUs to give."""
    if why is None:
        why = NoGpu("none_allocated", "This project holds no GPU.", "")
    cpu = dict(dataclasses.asdict(req), gpus="")
    words = f"--gpus {req.gpus}: {why.message} "
    words += f"To run on the CPU, leave out --gpus: gpulab-job run {command_line(cpu)}"
    if req.kind == "script" and req.gpus == "all":
        words += (
            " (one process; for several CPU processes: gpulab-job run -- "
            f"torchrun --nproc-per-node=4 {command_line(cpu)})"
        )
    words += "."
    if why.reason == "none_allocated" and why.hint:
        words += f" For GPUs: {why.hint}"
    elif why.reason == "no_driver" and why.hint:
        words += " " + why.hint.removeprefix("Your code runs on the CPU. ")
    return words


def command(req: JobRequest, machine: Machine, python: str, output: str = "") -> list[str]:
    """The argument list the supervisor runs (never a shell line)."""
    if req.kind == "command":
        if req.gpus:
            processes(req, machine)  # the GPUs asked for are there
        return list(req.command)
    if req.kind == "notebook":
        # nbclient through nbconvert: the executed copy, outputs and all, next to it.
        folder, _, name = output.rpartition("/")
        return [
            python, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
            "--ExecutePreprocessor.timeout=-1", f"--output-dir={folder or '.'}",
            f"--output={name}", req.target,
        ]  # fmt: skip
    n = processes(req, machine)
    if req.gpus == "":
        return [python, "-u", req.target, *req.args]
    return [
        python, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={n}", req.target, *req.args,
    ]  # fmt: skip


def environment(req: JobRequest, machine: Machine, base: dict[str, str]) -> dict[str, str]:
    """``base`` (the server's environment) plus what the job's processes need."""
    env = dict(base)
    env["PYTHONUNBUFFERED"] = "1"  # the log shows lines as they are printed
    precision = req.precision
    if precision == "auto":
        precision = precision_for(machine.capabilities)
    if precision:
        env["GPULAB_PRECISION"] = precision
        env["ACCELERATE_MIXED_PRECISION"] = "no" if precision == "fp32" else precision
    if req.gpus:
        n = processes(req, machine)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(n))
        env["OMP_NUM_THREADS"] = str(max(1, machine.cpus // n))
        # One host: NCCL talks over shared memory and PCIe/NVLink; its socket
        # bootstrap stays on the loopback device of the container.
        env.setdefault("NCCL_SOCKET_IFNAME", "lo")
        env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    return env
