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

On a cluster whose nodes run Docker engines of their own (``NodeEngine``), the
script first points ``DOCKER_HOST`` at its node's engine, makes the project
network there if it is missing (the options of ``host.ensure_network``: one
source, objects.NETWORK_*), and pulls the image by digest from the cluster's
registry. With ``publish`` it gives the container's port on the node's cluster
address (``-p <address>::<port>``, Docker picks the host port) and prints
``gpulab-ready <address>:<host port>`` once Docker has published it. Lines for the
hub: ``gpulab-progress: <words>`` (shown while the project starts), ``gpulab: <words>``
(why the job failed); the container's own output never reaches the job's log
(only lines the script writes, so a project cannot forge one).

Stopping: ``scancel`` sends TERM to the script, whose trap removes the container
(``docker run`` alone would leave it running); a job killed outright (SIGKILL, a
lost step) is cleaned by the Epilog, which removes every container labelled with
the job's id on this cluster. Every value is validated by full match and written
with ``shlex.quote``; environment values reach ``docker run`` through
``--env-file /dev/stdin`` and never stand on a command line.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
from dataclasses import dataclass, field, replace

from gpulab_hub.cluster import ClusterError, gres_type, slurm_name
from gpulab_hub.cluster.dockerargs import DockerRun, bind_mount, env_lines, run_args
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
# DOCKER_HOST of the nodes' engines, "{node}" standing for the node's name.
_DOCKER_HOST = re.compile(r"unix:///[A-Za-z0-9._/-]{1,200}|tcp://[A-Za-z0-9.-]{1,200}:[0-9]{1,5}")
_NETWORK = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_DIGEST_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:-]{0,200}@sha256:[0-9a-f]{64}")
_NODE_RE = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"  # Slurm names, as cluster.slurm_name
READY = "gpulab-ready"
PROGRESS = "gpulab-progress:"
FAILURE = "gpulab:"


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
    dev_dir: str = "/dev"  # the node's folder of the control devices (isolation "devices")
    driver_dir: str = objects.GpuAssignment.driver_dir
    alloc_conf: str = objects.GpuAssignment.alloc_conf


@dataclass(frozen=True)
class NodeEngine:
    """The Docker engine of the node a job runs on, and what the script asks of it
    before the container starts."""

    host: str = ""  # DOCKER_HOST, "{node}" for the node's name; "" = the node's default
    config: str = ""  # folder on the node with Docker's config.json (registry credentials)
    pull: bool = False  # pull the container's image (a digest reference) first
    network: bool = False  # make the project network if missing (objects.NETWORK_*)


@dataclass(frozen=True)
class NodeAddress:
    """A node's cluster address (Slurm's NodeAddr, as an IP), where the container's port
    is published for the hub."""

    node: str
    address: str


@dataclass(frozen=True)
class BatchJob:
    """Everything the batch script depends on."""

    cluster: str
    container: objects.ContainerInputs
    gpus: SlurmGpus = field(default_factory=SlurmGpus)
    docker: str = "docker"  # the Docker CLI on the nodes (found on SCRIPT_PATH)
    engine: NodeEngine = field(default_factory=NodeEngine)
    # Publish the container's port on the node's address (each node the job may get)
    # and print READY; () publishes nothing (the container is reached some other way).
    publish: tuple[NodeAddress, ...] = ()
    ready_timeout: int = 120  # seconds Docker may take to publish the port


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


def _match_name(value: str, what: str) -> str:
    if not isinstance(value, str) or _NETWORK.fullmatch(value) is None or ".." in value:
        raise ClusterError(f"{what} {value!r} cannot go into a batch script")
    return value


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
    for path in (gpus.nvidia_proc, gpus.driver_dir, gpus.dev_dir):
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
        controls = " ".join(
            "--device " + _q(f"{gpus.dev_dir}/{os.path.basename(d)}:{d}:rwm")
            for d in objects.CONTROL_DEVICES
        )
        drv = gpus.driver_dir
        mount = " ".join(_q(a) for a in bind_mount(drv, drv, readonly=True))
        out += f"gpu_opts+=({controls} {mount})\n"
        out += f"gpu_opts+=(-e {_q(f'LD_LIBRARY_PATH={drv}/lib64')})\n"
    out += (
        'gpu_opts+=(-e "NVIDIA_VISIBLE_DEVICES=$ids" -e "CUDA_VISIBLE_DEVICES=$ids")\n'
        f"gpu_opts+=(-e {_q(f'PYTORCH_CUDA_ALLOC_CONF={gpus.alloc_conf}')})\n"
    )
    return out


def _docker_host(template: str) -> tuple[str, str]:
    """What stands before and after the node's name in a DOCKER_HOST template."""
    before, _, after = template.partition("{node}")
    example = template.replace("{node}", "node", 1)
    if _DOCKER_HOST.fullmatch(example) is None or ".." in example or "{" in before + after:
        raise ClusterError(
            f"DOCKER_HOST {template!r} cannot go into a batch script: unix:///<path> or "
            "tcp://<host>:<port>, with {node} for the node's name"
        )
    return before, after


def _node_block(engine: NodeEngine, on_bad: str) -> str:
    """Shell that checks the node's name (SLURMD_NODENAME) and points Docker at the
    node's engine."""
    out = (
        "node=${SLURMD_NODENAME:-}\n"
        f"if [[ ! $node =~ {_NODE_RE} ]]; then\n"
        f"  {on_bad}\n"
        "fi\n"
    )
    if engine.host:
        before, after = _docker_host(engine.host)
        out += f'export DOCKER_HOST={_q(before)}"$node"{_q(after)}\n'
    return out


def _network_block(network: str) -> str:
    """Shell that makes the project network on the node's engine if missing (as
    host.ensure_network does here; a concurrent make by another job is fine) and
    refuses one that is not gpulab's: a bridge with traffic between containers off."""
    net = _q(objects.check_network(_match_name(network, "Network")))
    opts = [f"--opt {_q(f'{k}={v}')}" for k, v in sorted(objects.NETWORK_OPTIONS.items())]
    opts += [f"--label {_q(f'{k}={v}')}" for k, v in sorted(objects.NETWORK_LABELS.items())]
    fmt = "{{.Driver}}" + "".join(
        f' {{{{index .Options "{k}"}}}}' for k in sorted(objects.NETWORK_OPTIONS)
    )
    options = sorted(objects.NETWORK_OPTIONS.items())
    want = " ".join([objects.NETWORK_DRIVER, *(v for _, v in options)])
    return (
        f"net={net}\n"
        'if ! "$docker" network inspect "$net" >/dev/null 2>&1; then\n'
        f'  "$docker" network create --driver {_q(objects.NETWORK_DRIVER)} {" ".join(opts)} '
        '"$net" >/dev/null 2>&1 || true\n'
        "fi\n"
        f'have=$("$docker" network inspect --format {_q(fmt)} "$net" 2>/dev/null || true)\n'
        f"if [ \"$have\" != {_q(want)} ]; then\n"
        '  if [ -z "$have" ]; then\n'
        '    echo "gpulab: the Docker engine of node $node does not answer or cannot make the'
        ' project network $net; ask the administrator (docs/cluster.md)" >&2\n'
        "  else\n"
        '    echo "gpulab: the network $net on node $node is not gpulab\'s (a bridge with'
        ' traffic between containers off); ask the administrator to remove it" >&2\n'
        "  fi\n"
        "  exit 1\n"
        "fi\n"
    )


def _pull_block(engine: NodeEngine, image: str) -> str:
    """Shell that pulls the image (a digest reference: what a tag names can change) into
    the node's engine, with the registry's credentials where the nodes keep them."""
    if _DIGEST_REF.fullmatch(image) is None:
        raise ClusterError(f"Image {image!r} is not a reference by digest; nodes pull by digest")
    config = ""
    if engine.config:
        if _NODE_PATH.fullmatch(engine.config) is None or ".." in engine.config:
            raise ClusterError(f"Folder {engine.config!r} cannot go into a batch script")
        config = f" --config {_q(engine.config)}"
    return (
        f'echo "{PROGRESS} Fetching the project\'s image on node $node"\n'
        f'if ! pulled=$("$docker"{config} pull -q {_q(image)} 2>&1); then\n'
        '  echo "gpulab: node $node could not fetch the project\'s image from the cluster\'s'
        ' registry: $(printf \'%s\\n\' "$pulled" | tail -n 1 | cut -c1-300)" >&2\n'
        "  exit 1\n"
        "fi\n"
    )


def _address_cases(publish: tuple[NodeAddress, ...]) -> str:
    lines = ['case "$node" in']
    for n in publish:
        slurm_name(n.node, "Node")
        try:
            address = str(ipaddress.IPv4Address(n.address))
        except ValueError:
            raise ClusterError(
                f"Node {n.node}'s cluster address {n.address!r} is not an IPv4 address"
            ) from None
        lines.append(f"  {_q(n.node)}) node_addr={address} ;;")
    lines.append(
        '  *) echo "gpulab: node $node has no cluster address in gpulab\'s list; ask the'
        ' administrator (docs/cluster.md)" >&2; exit 1 ;;'
    )
    lines.append("esac")
    return "\n".join(lines) + "\n"


def _ready_block(job: BatchJob) -> str:
    """Shell that waits (bounded) until Docker has published the container's port on the
    node's address, then prints READY; a container that stops first fails the job with
    its last lines."""
    timeout = job.ready_timeout
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 1 <= timeout <= 3600:
        raise ClusterError(f"Ready timeout {timeout!r} must be 1 to 3600 seconds")
    name = _q(job.container.name)
    port = f"{int(job.container.port)}/tcp"
    return (
        "run_pid=$!\n"
        "hostport=\n"
        f"for ((i = 0; i < {timeout * 5}; i++)); do\n"
        '  if ! kill -0 "$run_pid" 2>/dev/null; then\n'
        '    echo "gpulab: the project\'s container on node $node stopped before it was ready;'
        ' its last lines:" >&2\n'
        "    tail -n 15 -- \"$out\" | cut -c1-600 | sed 's/^/gpulab:   /' >&2\n"
        "    exit 1\n"
        "  fi\n"
        "  while read -r line; do\n"
        "    if [[ $line =~ ^([0-9.]+):([0-9]{1,5})$ ]] &&\n"
        '      [ "${BASH_REMATCH[1]}" = "$node_addr" ]; then\n'
        "      hostport=${BASH_REMATCH[2]}\n"
        "    fi\n"
        f'  done < <("$docker" port {name} {port} 2>/dev/null || true)\n'
        '  if [ -n "$hostport" ]; then break; fi\n'
        "  sleep 0.2\n"
        "done\n"
        'if [ -z "$hostport" ]; then\n'
        f'  echo "gpulab: Docker on node $node did not publish the project\'s port within'
        f' {timeout} s" >&2\n'
        "  exit 1\n"
        "fi\n"
        f'echo "{READY} $node_addr:$hostport"\n'
        'wait "$run_pid"\n'
    )


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
    on_node = job.engine != NodeEngine() or bool(job.publish)
    node = (
        _node_block(
            job.engine,
            'echo "gpulab: this job runs on no node gpulab can name (SLURMD_NODENAME)" >&2;'
            " exit 1",
        )
        if on_node
        else ""
    )
    prepare = _network_block(job.container.network) if job.engine.network else ""
    prepare += _pull_block(job.engine, run.image) if job.engine.pull else ""
    publish = ""
    if job.publish:
        prepare = _address_cases(job.publish) + prepare
        prepare += (
            f'echo "{PROGRESS} Starting the project\'s container on node $node"\n'
            "out=$(mktemp)  # the container's output: never in the job's log\n"
            "trap 'gpulab_remove; rm -f -- \"$out\"' EXIT\n"
        )
        publish = f'  -p "$node_addr::{int(job.container.port)}" \\\n'
    gpu = _gpu_block(job.gpus)
    pairs = zip(run.options[::2], run.options[1::2], strict=True)
    options = " \\\n  ".join(f"{_q(flag)} {_q(value)}" for flag, value in pairs)
    command = " ".join(_q(a) for a in run.command)
    env = "\n".join(env_lines(run.env))
    output = ' >"$out" 2>&1' if job.publish else ""
    after = _ready_block(job) if job.publish else 'wait "$!"\n'
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
        + node
        + _remove_function(job.cluster, docker)
        + "trap 'exit 143' TERM\n"
        "trap 'exit 130' INT\n"
        "trap gpulab_remove EXIT\n"
        + gpu
        + prepare
        + '"$docker" run --rm --env-file /dev/stdin \\\n'
        f"  {options} \\\n"
        f'  --label "{JOB_LABEL}=$job" \\\n'
        + publish
        + '  "${gpu_opts[@]}" \\\n'
        f"  {_q(run.image)} {command} <<'{ENV_END}'{output} &\n"
        f"{env}\n"
        f"{ENV_END}\n" + after
    )


def render_epilog(cluster: str, docker: str = "docker", docker_host: str = "") -> str:
    """The cluster's Epilog (slurm.conf ``Epilog=``): removes the containers of the job
    that just ended, from the node's engine (``docker_host``: the spawner's
    ``node_docker_host``). An Epilog that fails drains the node, so this one exits 0."""
    cluster = slurm_name(cluster, "Cluster")
    docker = _docker_bin(docker)
    node = _node_block(NodeEngine(host=docker_host), "exit 0") if docker_host else ""
    return (
        "#!/bin/bash\n"
        f"# gpulab Epilog of Slurm cluster {cluster}: removes the containers a job's batch\n"
        "# script started when the job ended without its trap (SIGKILL, a lost step).\n"
        "# Rendered by gpulab_hub.cluster.batch (docs/cluster.md).\n"
        f"export PATH={SCRIPT_PATH}\n"
        f"docker={_q(docker)}\n"
        + _job_id_check("exit 0")
        + node
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
