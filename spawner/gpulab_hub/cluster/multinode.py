"""The batch script of a multi-node job: ``torchrun`` on N nodes, one ``srun`` task per
node, each task a ``docker run`` of the project's image with the container's usual
protections (docs/cluster.md, "Multi-node jobs").

Pure functions of what the hub decided (the request, checked here against the
administrator's limits; the job network and the addresses the hub assigned; the
project's container settings and image digest): tests compare the whole script.

What each node's task does, in order, reusing batch.py's pieces (never copies):

- checks Slurm's job id and its node index (``SLURM_NODEID``, 0 to N-1), points
  Docker at its node's engine (``batch._node_block``);
- takes its GPUs from ``SLURM_STEP_GPUS``: in an ``srun`` task, ``SLURM_JOB_GPUS`` is
  the batch node's allocation, copied into every task's environment (seen on Slurm
  22.05: node 1's task says ``SLURM_JOB_GPUS=0`` while its step holds GPU 1), then maps
  them as a project container's (``batch._gpu_block``);
- makes the job network (a macvlan network on the node's cluster interface) on its
  engine if missing, and refuses one that is not what gpulab would make;
- pulls the project's image by digest (``batch._pull_block``);
- runs the container on the job network at the address the hub assigned to its node
  index, with the command ``torchrun --nnodes=N --nproc-per-node=G
  --node-rank=<index> --master-addr=<address of index 0> --master-port=29500
  <script> <args>`` under gpulab's node wrapper (``gpulab_jupyter.jobs.node``), which
  writes the node's output to ``jobs/<id>/`` in the project folder as the notebook
  user (never as root, never through a link the project made);
- traps TERM (``scancel``) and removes the job's containers on its node on exit; a
  task killed outright leaves them to the cluster's Epilog (same labels as batch.py).

The batch script itself runs on the first node: it starts the tasks with
``srun --kill-on-bad-exit`` (one node failing ends the others) and hands the
container's environment to every task on srun's standard input (``--input=all``),
so no value stands on a command line. The tasks' environment is Slurm's alone: the
batch runs with ``--export=NONE`` and Slurm hands srun ``SLURM_EXPORT_ENV=NONE``, so
the task sets its own PATH.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from dataclasses import dataclass, field, replace

from gpulab_contract import environment
from gpulab_contract.jobs import JOB_ID
from gpulab_hub.cluster import ClusterError, batch, slurm_name
from gpulab_hub.cluster.batch import (
    CLUSTER_LABEL,
    ENV_END,
    FAILURE,
    JOB_LABEL,
    PROGRESS,
    SCRIPT_PATH,
    BatchJob,
    NodeEngine,
    SlurmGpus,
)
from gpulab_hub.cluster.dockerargs import DockerRun, env_lines
from gpulab_hub.projects import objects

MASTER_PORT = 29500
NODE_MODULE = "gpulab_jupyter.jobs.node"  # the node wrapper in the project image
JOB_LABEL_ID = "gpulab.job"  # gpulab's job id on each container of the job
NETWORK_LABEL = "gpulab.network"
NETWORK_KIND = "jobs"  # the label's value on job networks (project networks: "projects")
TASK_END = "GPULAB_TASK"
MAX_ARGS = 256
MAX_ARG_LEN = 4096
# A script inside the project: folders and a file name of letters, digits and ._+- and
# spaces, ending in .py; never absolute, never "..", never starting with "-".
_SEGMENT = r"[A-Za-z0-9_][A-Za-z0-9._+ -]{0,126}"
_SCRIPT = re.compile(rf"(?:{_SEGMENT}/){{0,15}}{_SEGMENT}\.py")
_ARG = re.compile(r"[^\x00-\x1f\x7f]*")  # printable: no line break, tab or escape
_IFACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,14}")  # Linux: 15 characters
_PYTHON = re.compile(r"[A-Za-z0-9._/-]{1,255}")


@dataclass(frozen=True)
class Limits:
    """What the administrator allows one multi-node job (the spawner's settings)."""

    max_nodes: int = 4
    max_gpus_per_node: int = 8


@dataclass(frozen=True)
class TrainRequest:
    """What the user asked: ``--nodes N --gpus-per-node G <script> <args>``."""

    job_id: str  # gpulab's job id (the project's jobs/<id>/ folder)
    script: str  # project-relative .py
    args: tuple[str, ...] = ()
    nodes: int = 2
    gpus_per_node: int = 0  # 0: a CPU job, one process per node

    @property
    def processes_per_node(self) -> int:
        return max(1, self.gpus_per_node)


@dataclass(frozen=True)
class JobNetwork:
    """The macvlan network of multi-node jobs, the same on every node's engine."""

    name: str
    parent: str  # the nodes' cluster interface ("eth0", "bond0.42")
    subnet: str  # "10.20.0.0/16": the cluster network's
    ip_range: str = ""  # where gpulab assigns job addresses ("" = the whole subnet)
    gateway: str = ""  # "" = the subnet's first address (given to Docker explicitly)

    def checked(self) -> JobNetwork:
        """This network, or ClusterError naming the setting that is wrong."""
        batch._match_name(self.name, "Job network")
        if _IFACE.fullmatch(self.parent) is None:
            raise ClusterError(f"Job network interface {self.parent!r} is not an interface name")
        subnet = _network(self.subnet, "job_network_subnet")
        ip_range = _network(self.ip_range or self.subnet, "job_network_range")
        if not ip_range.subnet_of(subnet):
            raise ClusterError(f"job_network_range {ip_range} is not inside {subnet}")
        # Docker takes a network's gateway from its --ip-range when none is given (an
        # address gpulab assigns): always name one.
        gateway = next(subnet.hosts())
        if self.gateway:
            try:
                gateway = ipaddress.IPv4Address(self.gateway)
            except ValueError:
                raise ClusterError(f"job_network_gateway {self.gateway!r} is no address") from None
            if gateway not in subnet:
                raise ClusterError(f"job_network_gateway {gateway} is not in {subnet}")
        return replace(self, subnet=str(subnet), ip_range=str(ip_range), gateway=str(gateway))

    def assignable(self) -> list[str]:
        """The addresses gpulab may give job containers, in order."""
        net = self.checked()
        subnet = ipaddress.IPv4Network(net.subnet)
        skip = {subnet.network_address, subnet.broadcast_address}
        skip.add(ipaddress.IPv4Address(net.gateway))
        return [str(a) for a in ipaddress.IPv4Network(net.ip_range) if a not in skip]


@dataclass(frozen=True)
class MultiNodeJob:
    """Everything the batch script of one multi-node job depends on."""

    cluster: str
    request: TrainRequest
    container: objects.ContainerInputs  # the job's container (its network: the job network)
    network: JobNetwork
    addresses: tuple[str, ...]  # the job network address of each node index
    gpus: SlurmGpus = field(default_factory=SlurmGpus)  # count: GPUs per node
    engine: NodeEngine = field(default_factory=NodeEngine)  # the nodes' engines (pull: always)
    docker: str = "docker"
    master_port: int = MASTER_PORT
    python: str = "python3"  # the project image's Python (on the image's PATH)


def _q(value: str) -> str:
    return shlex.quote(value)


def _network(value: str, what: str) -> ipaddress.IPv4Network:
    try:
        return ipaddress.IPv4Network(value, strict=True)
    except ValueError:
        raise ClusterError(f"{what} {value!r} is not an IPv4 network like 10.20.0.0/16") from None


def check_request(req: TrainRequest, limits: Limits) -> TrainRequest:
    """The request, or ClusterError in the words the user sees."""
    if not isinstance(req.job_id, str) or JOB_ID.fullmatch(req.job_id) is None:
        raise ClusterError(f"{req.job_id!r} is not a job id (they look like 20261123-141502-a1b2).")
    nodes, gpus = req.nodes, req.gpus_per_node
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise ClusterError("--nodes must be a whole number of nodes, 1 or more.")
    if nodes > limits.max_nodes:
        raise ClusterError(
            f"--nodes {nodes}: a job on this cluster may use at most {limits.max_nodes} "
            "nodes (the administrator's limit). Ask for fewer."
        )
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise ClusterError("--gpus-per-node must be a whole number of GPUs (0 for CPUs only).")
    if gpus > limits.max_gpus_per_node:
        raise ClusterError(
            f"--gpus-per-node {gpus}: a job on this cluster may use at most "
            f"{limits.max_gpus_per_node} GPUs per node (the administrator's limit). Ask for fewer."
        )
    script = req.script
    if not isinstance(script, str) or not script.endswith(".py"):
        raise ClusterError(
            f"{script!r}: a multi-node job runs a Python script (.py) with torchrun."
        )
    if _SCRIPT.fullmatch(script) is None or ".." in script.split("/"):
        raise ClusterError(
            f"{script!r} is not a script gpulab can run on the cluster: name it by its path "
            "inside the project folder (like train.py or src/train.py: letters, digits, "
            "spaces and . _ + -)."
        )
    if not isinstance(req.args, tuple) or len(req.args) > MAX_ARGS:
        raise ClusterError(f"A job takes at most {MAX_ARGS} arguments.")
    for arg in req.args:
        if not isinstance(arg, str) or len(arg) > MAX_ARG_LEN or _ARG.fullmatch(arg) is None:
            raise ClusterError(
                f"The argument {arg[:40]!r} holds a line break or a control character (or "
                f"is longer than {MAX_ARG_LEN}): gpulab does not pass those to a cluster job."
            )
    return req


def log_name(rank: int) -> str:
    """The node's output file in ``jobs/<id>/``: the first node's is the job's
    ``output.log`` (what the Jobs panel opens), the others' ``output-node<k>.log``."""
    return "output.log" if rank == 0 else f"output-node{rank}.log"


def job_env(req: TrainRequest, cpus: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """The job container's environment (batch.py's heredoc carries it): what gpulab
    says about the project and the job, and where torch.distributed talks (the job
    network is the container's only interface, eth0). No token of the project's."""
    env = dict(base or {})
    env.update(
        {
            **environment.build(job_id=req.job_id, job_nodes=req.nodes),
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": str(max(1, cpus // req.processes_per_node)),
            "NCCL_SOCKET_IFNAME": "eth0",
            "GLOO_SOCKET_IFNAME": "eth0",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        }
    )
    return env


def command(job: MultiNodeJob) -> list[str]:
    """The container's command as shell words: the node wrapper, then torchrun (as
    ``python -m torch.distributed.run``, the same program). ``$rank`` is the task's
    node index; everything else is quoted."""
    req = job.request
    if _PYTHON.fullmatch(job.python) is None or ".." in job.python:
        raise ClusterError(f"Python {job.python!r} cannot go into a batch script")
    master = job.addresses[0]
    port = job.master_port
    if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535:
        raise ClusterError(f"Master port {port!r} must be 1024 to 65535")
    py = _q(job.python)
    return [
        py, "-m", NODE_MODULE, "--job", _q(req.job_id), "--rank", '"$rank"',
        "--nodes", str(req.nodes), "--",
        py, "-m", "torch.distributed.run",
        f"--nnodes={req.nodes}",
        f"--nproc-per-node={req.processes_per_node}",
        '--node-rank="$rank"',
        f"--master-addr={master}",
        f"--master-port={port}",
        _q(req.script),
        *(_q(a) for a in req.args),
    ]  # fmt: skip


def _addresses(job: MultiNodeJob) -> tuple[str, ...]:
    net = job.network.checked()
    allowed = set(net.assignable())
    if len(job.addresses) != job.request.nodes:
        raise ClusterError(
            f"The job has {job.request.nodes} nodes but {len(job.addresses)} addresses"
        )
    for a in job.addresses:
        if a not in allowed:
            raise ClusterError(f"Address {a!r} is not one gpulab assigns ({net.ip_range})")
    if len(set(job.addresses)) != len(job.addresses):
        raise ClusterError("Two nodes of one job got the same address")
    return job.addresses


def _network_block(net: JobNetwork, cluster: str) -> str:
    """Shell that makes the job network on the node's engine if missing (a concurrent
    make by another job's task is fine) and refuses one gpulab would not make."""
    net = net.checked()
    create = [
        "--driver macvlan",
        f"--subnet {_q(net.subnet)}",
        f"--ip-range {_q(net.ip_range)}",
        f"--gateway {_q(net.gateway)}",
        f"--opt {_q('parent=' + net.parent)}",
        f"--label {_q(f'{NETWORK_LABEL}={NETWORK_KIND}')}",
        f"--label {_q(f'{CLUSTER_LABEL}={cluster}')}",
    ]
    fmt = (
        '{{.Driver}} {{index .Options "parent"}}'
        "{{range .IPAM.Config}} {{.Subnet}} {{.IPRange}} {{.Gateway}}{{end}}"
    )
    want = f"macvlan {net.parent} {net.subnet} {net.ip_range} {net.gateway}"
    return (
        f"jobnet={_q(net.name)}\n"
        'if ! "$docker" network inspect "$jobnet" >/dev/null 2>&1; then\n'
        f'  "$docker" network create {" ".join(create)} "$jobnet" >/dev/null 2>&1 || true\n'
        "fi\n"
        f'have=$("$docker" network inspect --format {_q(fmt)} "$jobnet" 2>/dev/null || true)\n'
        f'if [ "$have" != {_q(want)} ]; then\n'
        '  if [ -z "$have" ]; then\n'
        f'    echo "{FAILURE} node $node cannot make the job network $jobnet (macvlan on'
        f' {net.parent}); ask the administrator (docs/cluster.md)" >&2\n'
        "  else\n"
        f'    echo "{FAILURE} the network $jobnet on node $node is not the job network gpulab'
        f' makes ({want}); ask the administrator to remove it" >&2\n'
        "  fi\n"
        "  exit 1\n"
        "fi\n"
    )


def _docker_run(job: MultiNodeJob) -> DockerRun:
    """The container's ``docker run`` (batch.docker_run: the spec's, checked)."""
    return batch.docker_run(BatchJob(job.cluster, job.container, job.gpus, job.docker))


def _run_options(run: DockerRun) -> str:
    """The ``docker run`` options, one a line, the container's name made per node."""
    if run.options[0] != "--name":
        raise ClusterError("The container spec starts with no name")
    lines = [f'--name {_q(run.options[1] + "-n")}"$rank"']
    pairs = zip(run.options[2::2], run.options[3::2], strict=True)
    lines += [f"{_q(flag)} {_q(value)}" for flag, value in pairs]
    return " \\\n  ".join(lines)


def render_task(job: MultiNodeJob) -> str:
    """The script of one node's srun task (bash; it reads the container's
    environment on its standard input)."""
    req = job.request
    cluster = slurm_name(job.cluster, "Cluster")
    addresses = _addresses(job)
    if job.gpus.count != req.gpus_per_node:
        raise ClusterError("The job's GPUs per node and its request disagree")
    engine = replace(job.engine, pull=True, network=False)
    run = _docker_run(job)
    docker = batch._docker_bin(job.docker)
    last = req.nodes - 1
    words = " ".join(command(job))
    return (
        "set -euo pipefail\n"
        f"export PATH={SCRIPT_PATH}\n"
        f"docker={_q(docker)}\n"
        + batch._job_id_check(
            f'echo "{FAILURE} this task runs in a Slurm job (no SLURM_JOB_ID)" >&2; exit 2'
        )
        + "rank=${SLURM_NODEID:-}\n"
        f"if [[ ! $rank =~ ^(0|[1-9][0-9]{{0,3}})$ ]] || (( rank > {last} )); then\n"
        f'  echo "{FAILURE} this task has no node index of this job (SLURM_NODEID=$rank)"'
        " >&2; exit 1\n"
        "fi\n"
        + batch._node_block(
            engine,
            f'echo "{FAILURE} this task runs on no node gpulab can name (SLURMD_NODENAME)"'
            " >&2; exit 1",
        )
        + "# In an srun task SLURM_JOB_GPUS is the first node's; the step's are this node's.\n"
        "SLURM_JOB_GPUS=${SLURM_STEP_GPUS:-}\n"
        "env_file=$(cat)\n"
        + batch._remove_function(cluster, docker)
        + "trap 'exit 143' TERM\n"
        "trap 'exit 130' INT\n"
        "trap gpulab_remove EXIT\n"
        + batch._gpu_block(job.gpus)
        + f"addresses=({' '.join(addresses)})\n"
        "address=${addresses[rank]}\n"
        + _network_block(job.network, cluster)
        + batch._pull_block(engine, run.image)
        + f'echo "{PROGRESS} Starting torchrun on node $node (node $rank of {req.nodes},'
        ' $address)"\n'
        "out=$(mktemp)  # Docker's own output; the job's goes to the project's jobs folder\n"
        "trap 'gpulab_remove; rm -f -- \"$out\"' EXIT\n"
        'rc=0\n"$docker" run --rm --env-file /dev/stdin \\\n'
        f"  {_run_options(run)} \\\n"
        '  --ip "$address" \\\n'
        f"  --label {_q(f'{JOB_LABEL_ID}={req.job_id}')} \\\n"
        f'  --label "{JOB_LABEL}=$job" \\\n'
        '  "${gpu_opts[@]}" \\\n'
        f'  {_q(run.image)} {words} >"$out" 2>&1 <<< "$env_file" &\n'
        'wait "$!" || rc=$?\n'
        'if [ "$rc" -ne 0 ]; then\n'
        f'  echo "{FAILURE} torchrun on node $node (node $rank) ended with exit code $rc;'
        f" the job's output is in jobs/{req.job_id}/\" >&2\n"
        f"  tail -n 5 -- \"$out\" | cut -c1-300 | sed 's/^/{FAILURE}   /' >&2\n"
        "fi\n"
        'exit "$rc"\n'
    )


def render_script(job: MultiNodeJob) -> str:
    """The whole batch script (bash) of one multi-node job."""
    req = job.request
    task = render_task(job)
    if any(line == TASK_END for line in task.splitlines()):
        raise ClusterError("The task script holds its own end marker")
    env = "\n".join(env_lines(_docker_run(job).env))
    n = req.nodes
    return (
        "#!/bin/bash\n"
        f"# gpulab: multi-node job {req.job_id} of {job.container.name} on Slurm cluster"
        f" {job.cluster}:\n"
        f"# {n} nodes, {req.gpus_per_node} GPUs each; one srun task per node runs torchrun in"
        " the\n"
        "# project's container. Rendered by gpulab_hub.cluster.multinode (docs/cluster.md);\n"
        "# stopping the job removes its containers on every node (each task's trap; the\n"
        "# cluster's Epilog if a task is killed).\n"
        "set -euo pipefail\n"
        f"export PATH={SCRIPT_PATH}\n"
        + batch._job_id_check(
            f'echo "{FAILURE} this script runs as a Slurm batch job (no SLURM_JOB_ID)" >&2;'
            " exit 2"
        )
        + f'echo "{PROGRESS} Starting on nodes $SLURM_JOB_NODELIST"\n'
        f"read -r -d '' task <<'{TASK_END}' || true\n"
        f"{task}"
        f"{TASK_END}\n"
        "trap 'exit 143' TERM\n"
        "trap 'exit 130' INT\n"
        f"srun --nodes={n} --ntasks={n} --ntasks-per-node=1 --kill-on-bad-exit=1"
        ' --input=all --label \\\n'
        f"  /bin/bash -c \"$task\" gpulab-task <<'{ENV_END}' &\n"
        f"{env}\n"
        f"{ENV_END}\n"
        'wait "$!"\n'
    )


def sbatch_args(job: MultiNodeJob, request: batch.JobRequest) -> list[str]:
    """sbatch's options: batch.sbatch_args (``--export=NONE``, an explicit ``--mem``
    per node, ``--gres=gpu[:type]:G`` per node, ...) for one task per node."""
    if request.gpus != job.request.gpus_per_node:
        raise ClusterError("The job's GPUs per node and its sbatch request disagree")
    return [
        *batch.sbatch_args(request),
        f"--nodes={job.request.nodes}",
        "--ntasks-per-node=1",
    ]
