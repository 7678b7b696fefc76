"""The batch script that runs a project's container as a Slurm job, the Epilog that
removes what a killed job left, and the sbatch options of the job.

The container is the project's usual one: ``objects.container_spec`` (its
protections, mounts, labels and limits) turned into ``docker run`` arguments by
dockerargs.py. Only the GPUs are decided on the node, when the job starts: Slurm
hands the job indexes into the node's GRES list (``SLURM_JOB_GPUS``), which are
positions in that list, not device minor numbers. The script maps each index to
the device file at that position (``NodeGpus.files``, the node's gres.conf order),
reads the file's minor number, finds that GPU's UUID in the NVIDIA driver's
``/proc`` files, and gives the container exactly those GPUs, as
``objects.gpu_host_config`` and ``objects.gpu_env`` would for the same UUIDs.

Stopping: ``scancel`` sends TERM to the script, whose trap removes the container
(``docker run`` alone would leave it running); a job killed outright (SIGKILL, a
lost step) is cleaned by the Epilog, which removes every container labelled with
the job's id on this cluster. Every value is validated by full match and written
with ``shlex.quote``; environment values reach ``docker run`` through
``--env-file /dev/stdin`` and never stand on a command line.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field, replace

from gpulab_hub.cluster import ClusterError, gres_type, slurm_name
from gpulab_hub.cluster.dockerargs import DockerRun, env_lines, run_args
from gpulab_hub.projects import objects

CLUSTER_LABEL = "gpulab.slurm.cluster"
JOB_LABEL = "gpulab.slurm.job"
SCRIPT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NVIDIA_PROC = "/proc/driver/nvidia/gpus"
ENV_END = "GPULAB_ENV"
# Keys the script sets from Slurm's allocation (objects.gpu_env names them).
_GPU_ENV_KEYS = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF")

_DEVICE_FILE = re.compile(r"/[A-Za-z0-9._/-]{1,255}")
_DOCKER = re.compile(r"[A-Za-z0-9._/-]{1,255}")
_TIME = re.compile(r"([0-9]{1,3}-)?[0-9]{1,6}(:[0-9]{2}){0,2}")
_NODE_PATH = re.compile(r"/[A-Za-z0-9._%/-]{0,1023}")
_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


@dataclass(frozen=True)
class NodeGpus:
    """One node's GPU device files, in the order of its GRES list (gres.conf)."""

    node: str
    files: tuple[str, ...]


@dataclass(frozen=True)
class SlurmGpus:
    """The GPUs a project asks Slurm for, and how the node gives them to the container."""

    count: int = 0
    type: str = ""  # GRES type ("h200"); "" for any
    nodes: tuple[NodeGpus, ...] = ()
    isolation: str = objects.RUNTIME  # or objects.DEVICES (explicit /dev/nvidia* nodes)
    nvidia_proc: str = NVIDIA_PROC  # the driver's per-GPU "information" files
    driver_dir: str = objects.GpuAssignment.driver_dir
    alloc_conf: str = objects.GpuAssignment.alloc_conf


@dataclass(frozen=True)
class BatchJob:
    """Everything the batch script depends on."""

    cluster: str
    container: objects.ContainerSettings
    gpus: SlurmGpus = field(default_factory=SlurmGpus)
    docker: str = "docker"  # the Docker CLI on the nodes (found on SCRIPT_PATH)


@dataclass(frozen=True)
class JobRequest:
    """The sbatch options of a project's job."""

    name: str
    mem_mb: int  # always explicit: a job without --mem takes a whole node's memory
    cpus: int = 1
    gpus: int = 0
    gpu_type: str = ""
    partition: str = ""
    time_limit: str = ""  # Slurm's forms: "90", "4:00:00", "2-00:00:00"; "" = partition's
    output: str = "/dev/null"  # the job's log on the node ("%j" is the job id)
    chdir: str = "/"


def _q(value: str) -> str:
    return shlex.quote(value)


def _docker_bin(value: str) -> str:
    if _DOCKER.fullmatch(value) is None or ".." in value:
        raise ClusterError(f"Docker command {value!r} cannot go into a batch script")
    return value


def _remove_function(cluster: str, docker: str) -> str:
    """Shell function removing every container of this job on this cluster."""
    label = _q(f"label={CLUSTER_LABEL}={cluster}")
    return (
        "gpulab_remove() {\n"
        f'  "$docker" ps -aq --filter {label} --filter "label={JOB_LABEL}=$job" \\\n'
        '    | xargs -r "$docker" rm -f >/dev/null 2>&1 || true\n'
        "}\n"
    )


def _job_id_check(on_bad: str) -> str:
    return f"job=${{SLURM_JOB_ID:-}}\nif [[ ! $job =~ ^[0-9]+$ ]]; then\n  {on_bad}\nfi\n"


def _node_cases(gpus: SlurmGpus) -> str:
    lines = ['case "${SLURMD_NODENAME:-}" in']
    for n in gpus.nodes:
        slurm_name(n.node, "Node")
        if not n.files:
            raise ClusterError(f"Node {n.node} has no GPU device files")
        for f in n.files:
            if _DEVICE_FILE.fullmatch(f) is None or ".." in f:
                raise ClusterError(f"GPU device file {f!r} cannot go into a batch script")
        files = " ".join(_q(f) for f in n.files)
        lines.append(f"  {_q(n.node)}) gres_files=({files}) ;;")
    lines.append(
        "  *) echo \"gpulab: node ${SLURMD_NODENAME:-?} is not in gpulab's list of GPU nodes;"
        ' ask the administrator (docs/cluster.md)" >&2; exit 1 ;;'
    )
    lines.append("esac")
    return "\n".join(lines) + "\n"


def _gpu_block(gpus: SlurmGpus) -> str:
    """Shell that fills ``gpu_opts`` from Slurm's allocation on this node."""
    if gpus.count == 0:
        return "gpu_opts=()\n"
    if gpus.isolation not in (objects.RUNTIME, objects.DEVICES):
        raise ClusterError(f"GPU isolation {gpus.isolation!r} cannot give a container GPUs")
    for path in (gpus.nvidia_proc, gpus.driver_dir):
        if _DEVICE_FILE.fullmatch(path) is None or ".." in path:
            raise ClusterError(f"Folder {path!r} cannot go into a batch script")
    if any(c in gpus.alloc_conf for c in "\n\r\0"):
        raise ClusterError("PYTORCH_CUDA_ALLOC_CONF holds a line break")
    count = gpus.count
    out = _node_cases(gpus)
    out += (
        "gpulab_uuid() {\n"
        "  local f\n"
        f"  for f in {_q(gpus.nvidia_proc)}/*/information; do\n"
        '    if [ -r "$f" ] && grep -Eq "^Device Minor:[[:space:]]*$1[[:space:]]*$" "$f"; then\n'
        "      sed -n 's/^GPU UUID:[[:space:]]*//p' \"$f\" | head -n 1\n"
        "      return 0\n"
        "    fi\n"
        "  done\n"
        "  return 1\n"
        "}\n"
        'IFS=, read -r -a picked <<< "${SLURM_JOB_GPUS:-}"\n'
        f'if [ "${{#picked[@]}}" -ne {count} ]; then\n'
        f"  echo \"gpulab: Slurm gave this job GPUs '${{SLURM_JOB_GPUS:-}}', not {count}\" >&2\n"
        "  exit 1\n"
        "fi\n"
        "gpu_opts=()\n"
        "uuids=()\n"
        'for i in "${picked[@]}"; do\n'
        "  if [[ ! $i =~ ^[0-9]+$ ]] || (( i >= ${#gres_files[@]} )); then\n"
        '    echo "gpulab: GPU index $i is not in node $SLURMD_NODENAME\'s GRES list" >&2\n'
        "    exit 1\n"
        "  fi\n"
        "  dev=${gres_files[i]}\n"
        '  if [ ! -c "$dev" ]; then\n'
        '    echo "gpulab: $dev (GPU index $i on $SLURMD_NODENAME) is not a device" >&2\n'
        "    exit 1\n"
        "  fi\n"
        '  minor=$((16#$(stat -L -c %T -- "$dev")))\n'
        '  uuid=$(gpulab_uuid "$minor" || true)\n'
        "  if [[ ! $uuid =~ ^GPU-[0-9A-Za-z-]{1,80}$ ]]; then\n"
        '    echo "gpulab: no NVIDIA GPU with minor number $minor ($dev) on'
        ' $SLURMD_NODENAME" >&2\n'
        "    exit 1\n"
        "  fi\n"
        '  uuids+=("$uuid")\n'
    )
    if gpus.isolation == objects.DEVICES:
        out += '  gpu_opts+=(--device "$dev:/dev/nvidia$minor:rwm")\n'
    out += "done\n"
    out += 'ids=$(IFS=,; echo "${uuids[*]}")\n'
    if gpus.isolation == objects.RUNTIME:
        request = objects.gpu_host_config(
            objects.GpuAssignment(uuids=("GPU-0",), isolation=objects.RUNTIME)
        )["device_requests"][0]
        caps = ",".join(c for c in request["capabilities"][0] if c != "gpu")
        out += (
            'gpu_opts+=(--gpus "\\"driver=nvidia\\",\\"device=$ids\\",'
            f'\\"capabilities={caps}\\"")\n'
        )
    else:
        controls = " ".join(f"--device {_q(f'{d}:{d}:rwm')}" for d in objects.CONTROL_DEVICES)
        drv = gpus.driver_dir
        out += f"gpu_opts+=({controls} -v {_q(f'{drv}:{drv}:ro')})\n"
        out += f"gpu_opts+=(-e {_q(f'LD_LIBRARY_PATH={drv}/lib64')})\n"
    out += (
        'gpu_opts+=(-e "NVIDIA_VISIBLE_DEVICES=$ids" -e "CUDA_VISIBLE_DEVICES=$ids")\n'
        f"gpu_opts+=(-e {_q(f'PYTORCH_CUDA_ALLOC_CONF={gpus.alloc_conf}')})\n"
    )
    return out


def docker_run(job: BatchJob) -> DockerRun:
    """The container's ``docker run`` with everything but Slurm's GPUs."""
    cluster = slurm_name(job.cluster, "Cluster")
    s = job.container
    if s.gpus != objects.GpuAssignment():
        raise ClusterError("On a Slurm cluster, Slurm decides the GPUs: the settings name none")
    s = replace(s, labels={**s.labels, CLUSTER_LABEL: cluster})
    run = run_args(objects.container_spec(s))
    if job.gpus.count:
        env = {k: v for k, v in run.env.items() if k not in _GPU_ENV_KEYS}
        run = replace(run, env=env)
    return run


def render_script(job: BatchJob) -> str:
    """The whole batch script (bash) for one project container."""
    if job.gpus.count < 0:
        raise ClusterError("A project cannot ask for fewer than no GPUs")
    run = docker_run(job)
    docker = _docker_bin(job.docker)
    gpu = _gpu_block(job.gpus)
    pairs = zip(run.options[::2], run.options[1::2], strict=True)
    options = " \\\n  ".join(f"{_q(flag)} {_q(value)}" for flag, value in pairs)
    command = " ".join(_q(a) for a in run.command)
    env = "\n".join(env_lines(run.env))
    return (
        "#!/bin/bash\n"
        f"# gpulab: project container {job.container.name} on Slurm cluster {job.cluster}.\n"
        "# Rendered by gpulab_hub.cluster.batch (docs/cluster.md); stopping the job stops\n"
        "# and removes the container (the trap below; the cluster's Epilog if killed).\n"
        "set -euo pipefail\n"
        f"export PATH={SCRIPT_PATH}\n"
        f"docker={_q(docker)}\n"
        + _job_id_check(
            'echo "gpulab: this script runs as a Slurm batch job (no SLURM_JOB_ID)" >&2; exit 2'
        )
        + _remove_function(job.cluster, docker)
        + "trap 'exit 143' TERM\n"
        "trap 'exit 130' INT\n"
        "trap gpulab_remove EXIT\n" + gpu + '"$docker" run --rm --env-file /dev/stdin \\\n'
        f"  {options} \\\n"
        f'  --label "{JOB_LABEL}=$job" \\\n'
        '  "${gpu_opts[@]}" \\\n'
        f"  {_q(run.image)} {command} <<'{ENV_END}' &\n"
        f"{env}\n"
        f"{ENV_END}\n"
        'wait "$!"\n'
    )


def render_epilog(cluster: str, docker: str = "docker") -> str:
    """The cluster's Epilog (slurm.conf ``Epilog=``): removes the containers of the job
    that just ended. An Epilog that fails drains the node, so this one exits 0."""
    cluster = slurm_name(cluster, "Cluster")
    docker = _docker_bin(docker)
    return (
        "#!/bin/bash\n"
        f"# gpulab Epilog of Slurm cluster {cluster}: removes the containers a job's batch\n"
        "# script started when the job ended without its trap (SIGKILL, a lost step).\n"
        "# Rendered by gpulab_hub.cluster.batch (docs/cluster.md).\n"
        f"export PATH={SCRIPT_PATH}\n"
        f"docker={_q(docker)}\n"
        + _job_id_check("exit 0")
        + _remove_function(cluster, docker)
        + "gpulab_remove\n"
        "exit 0\n"
    )


def _positive(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ClusterError(f"{what} must be a whole number of at least 1, not {value!r}")
    return value


def sbatch_args(req: JobRequest) -> list[str]:
    """sbatch's options for one job (the script goes on its standard input)."""
    if _JOB_NAME.fullmatch(req.name) is None:
        raise ClusterError(f"Job name {req.name!r} is not one gpulab accepts")
    for path in (req.output, req.chdir):
        if _NODE_PATH.fullmatch(path) is None or ".." in path:
            raise ClusterError(f"Path {path!r} cannot go to sbatch")
    args = [
        "--parsable",
        "--export=NONE",  # the hub's environment (its secrets) stays on the hub
        "--no-requeue",
        f"--job-name={req.name}",
        f"--chdir={req.chdir}",
        f"--output={req.output}",
        f"--cpus-per-task={_positive(req.cpus, 'CPUs')}",
        f"--mem={_positive(req.mem_mb, 'Memory (MB)')}M",
    ]
    if req.partition:
        args.append(f"--partition={slurm_name(req.partition, 'Partition')}")
    if req.time_limit:
        if _TIME.fullmatch(req.time_limit) is None:
            raise ClusterError(f"Time limit {req.time_limit!r} is not one Slurm reads")
        args.append(f"--time={req.time_limit}")
    if req.gpus:
        _positive(req.gpus, "GPUs")
        kind = f"{gres_type(req.gpu_type)}:" if req.gpu_type else ""
        args.append(f"--gres=gpu:{kind}{req.gpus}")
    elif req.gpu_type:
        raise ClusterError("A GPU type without GPUs")
    return args
