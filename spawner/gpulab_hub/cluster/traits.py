"""Traits of gpulab on a Slurm cluster (mixed into ProjectSlurmSpawner): where Slurm
is, what a project's job asks for, how images reach the nodes and how the hub and the
nodes reach each other. Every setting is a trait with help (docs/reference.md is made
from it; docs/cluster.md shows a whole configuration).
"""

from __future__ import annotations

from traitlets import Dict, Float, HasTraits, Int, List, Unicode

from gpulab_hub.cluster.batch import NVIDIA_PROC
from gpulab_hub.cluster.slurm import DEFAULT_PATH


class ClusterTraits(HasTraits):
    """Traits of the cluster side (mixed into ProjectSlurmSpawner)."""

    slurm_conf = Unicode(
        "",
        config=True,
        help="""The cluster's slurm.conf, given to Slurm's commands as SLURM_CONF (a
        spawner's environment has none); "" for Slurm's own default
        (/etc/slurm/slurm.conf). Default: "".
        Example: ``c.ProjectSlurmSpawner.slurm_conf = "/etc/slurm/slurm.conf"``""",
    )
    slurm_path = Unicode(
        DEFAULT_PATH,
        config=True,
        help="""PATH in which the hub finds sbatch, squeue, scancel and sinfo.
        Default: /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin.
        Example: ``c.ProjectSlurmSpawner.slurm_path = "/opt/slurm/bin:/usr/bin:/bin"``""",
    )
    cluster_name = Unicode(
        "gpulab",
        config=True,
        help="""gpulab's name for the cluster, in the label of every project container
        it starts there (``gpulab.slurm.cluster``); the cluster's Epilog removes the
        containers of a job with that label, so render the Epilog with the same name
        (docs/cluster.md). A Slurm name: letters, digits, "_" and "-".
        Default: gpulab. Example: ``c.ProjectSlurmSpawner.cluster_name = "lab"``""",
    )
    partition = Unicode(
        "",
        config=True,
        help="""Slurm partition of project jobs; "" for the cluster's default partition.
        Default: "". Example: ``c.ProjectSlurmSpawner.partition = "gpu"``""",
    )
    gpu_type = Unicode(
        "",
        config=True,
        help="""GRES type of the GPUs projects get (``--gres=gpu:<type>:N``), "" for any
        type. With ``gpu_allowed_types`` (GRES types there) the user picks one on the
        spawn form instead. Default: "".
        Example: ``c.ProjectSlurmSpawner.gpu_type = "h200"``""",
    )
    node_gpus = Dict(
        key_trait=Unicode(),
        value_trait=List(Unicode()),
        config=True,
        help="""Each GPU node's GPU device files, in the order of its GRES list
        (gres.conf). Slurm hands a job positions in that list, not device numbers: the
        batch script maps each position to the file listed here. A GPU project on a
        node missing here fails with a sentence that names the node. Default: {} (no
        GPU projects). Example:
        ``c.ProjectSlurmSpawner.node_gpus = {"gpu-01": ["/dev/nvidia0", "/dev/nvidia1"]}``""",
    )
    gpu_isolation = Unicode(
        "auto",
        config=True,
        help="""How the nodes' engines give containers their GPUs: "runtime" (the
        NVIDIA container runtime or CDI, by UUID) or "devices" (the /dev/nvidia* files,
        the control devices of ``node_dev_dir`` and ``driver_dir`` mounted read-only;
        with user remapping, Docker takes each GPU from /dev/nvidia<minor> on the node).
        "auto" means "runtime" on a cluster (the hub cannot see the nodes' engines).
        Default: auto. Example: ``c.ProjectSlurmSpawner.gpu_isolation = "devices"``""",
    )
    node_dev_dir = Unicode(
        "/dev",
        config=True,
        help="""Folder on the nodes holding the NVIDIA control devices (nvidiactl,
        nvidia-uvm, nvidia-uvm-tools) that ``gpu_isolation = "devices"`` gives GPU
        containers, at /dev in the container. Keep /dev where the nodes' engines remap
        users (gpulab's default): Docker then takes each device from the path the
        container sees, whatever path it is given.
        Default: /dev. Example: ``c.ProjectSlurmSpawner.node_dev_dir = "/dev"``""",
    )
    node_nvidia_proc = Unicode(
        NVIDIA_PROC,
        config=True,
        help="""Folder on the nodes where the NVIDIA driver describes each GPU
        (``<bus id>/information``: minor number and UUID), read by the batch script.
        Default: /proc/driver/nvidia/gpus.
        Example: ``c.ProjectSlurmSpawner.node_nvidia_proc = "/proc/driver/nvidia/gpus"``""",
    )
    default_time_limit = Unicode(
        "",
        config=True,
        help="""Slurm time limit of a project's job ("90" minutes, "8:00:00",
        "2-00:00:00"); the project stops when it is reached. "" for the partition's.
        Default: "". Example: ``c.ProjectSlurmSpawner.default_time_limit = "12:00:00"``""",
    )
    mem_mb = Int(
        16384,
        config=True,
        help="""Memory of a project's job in MB (``--mem``; a job without it takes a
        whole node's memory), also the container's memory limit on the node.
        Default: 16384. Example: ``c.ProjectSlurmSpawner.mem_mb = 65536``""",
    )
    cpus = Int(
        4,
        config=True,
        help="""CPUs of a project's job (``--cpus-per-task``), also the container's CPU
        limit on the node. Default: 4. Example: ``c.ProjectSlurmSpawner.cpus = 16``""",
    )
    registry = Unicode(
        "",
        config=True,
        help="""The registry (host:port) this machine's Docker engine pushes project
        images to; the nodes pull them from ``registry_for_nodes`` by digest. Required.
        Default: "". Example: ``c.ProjectSlurmSpawner.registry = "127.0.0.1:5000"``""",
    )
    registry_for_nodes = Unicode(
        "",
        config=True,
        help="""The same registry as the nodes reach it (host:port); "" for
        ``registry``. Default: "".
        Example: ``c.ProjectSlurmSpawner.registry_for_nodes = "10.1.0.1:5000"``""",
    )
    node_docker_host = Unicode(
        "",
        config=True,
        help="""DOCKER_HOST of each node's Docker engine, ``{node}`` standing for the
        node's Slurm name (unix:///<path> or tcp://<host>:<port>); "" for the node's
        default engine. Default: "".
        Example: ``c.ProjectSlurmSpawner.node_docker_host = "unix:///run/docker.sock"``""",
    )
    node_docker_config = Unicode(
        "",
        config=True,
        help="""Folder on the nodes holding a Docker ``config.json`` with the registry's
        credentials (``docker --config``), for pulling project images; "" for none.
        Default: "".
        Example: ``c.ProjectSlurmSpawner.node_docker_config = "/etc/gpulab/docker"``""",
    )
    job_log_dir = Unicode(
        "",
        config=True,
        help="""Hub-owned folder of project jobs' output files (what the batch script
        says: progress, readiness, failures). It must be on storage the nodes mount
        at the same path, writable by the user jobs run as. "" for
        <state_root>/cluster-jobs. Default: "".
        Example: ``c.ProjectSlurmSpawner.job_log_dir = "/shared/gpulab/jobs"``""",
    )
    queue_timeout = Float(
        1800,
        config=True,
        help="""Longest a project's job may wait in Slurm's queue, in seconds; then it is
        cancelled and the user told so. Keep it under JupyterHub's start_timeout (3600
        in gpulab). Default: 1800.
        Example: ``c.ProjectSlurmSpawner.queue_timeout = 900``""",
    )
    hub_address_for_nodes = Unicode(
        "",
        config=True,
        help="""Where project containers on the nodes reach the hub's API: an address
        (the hub's port is added) or address:port; "" for JupyterHub's own
        (hub_connect_ip, else hub_ip: set GPULAB_HUB_IP to the head's cluster address).
        Default: "". Example: ``c.ProjectSlurmSpawner.hub_address_for_nodes = "10.1.0.1"``""",
    )
    hub_peer_addresses = List(
        Unicode(),
        config=True,
        help="""The IPv4 addresses the hub and its proxy connect to the nodes from: a
        project's server on a node answers these (and its own loopback) and refuses
        every other peer with 403, so other projects on the cluster cannot use its
        published port (docs/cluster.md, "Only the hub reaches a project"). [] for the
        address of hub_address_for_nodes (else the hub's API address), resolved to
        IPv4. Name the proxy's machine here too where it is not the hub's.
        Default: []. Example: ``c.ProjectSlurmSpawner.hub_peer_addresses = ["10.1.0.1"]``""",
    )
