"""Settings of multi-node jobs on a Slurm cluster (``%gpu_job run --nodes N
--gpus-per-node G train.py``), mixed into ProjectSlurmSpawner; docs/cluster.md,
"Multi-node jobs", says how they fit together. Every setting is a trait with help
(docs/reference.md is made from it).
"""

from __future__ import annotations

import re
from pathlib import Path

from traitlets import HasTraits, Int, TraitError, Unicode, validate

from gpulab_contract import environment
from gpulab_hub.cluster import ClusterError, batch, slurm_name
from gpulab_hub.cluster.multinode import MASTER_PORT, JobNetwork, Limits

NODE_IMAGE = "node_image"  # the spawner's state: the image by digest the project runs
_DIGEST_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:-]{0,200}@sha256:[0-9a-f]{64}")
OFF = (
    "Multi-node jobs are off on this cluster: its administrator has not set the job "
    "network (c.ProjectSlurmSpawner.job_network_parent and job_network_subnet, "
    "docs/cluster.md)."
)


class MultiNodeJobTraits(HasTraits):
    """Traits of multi-node jobs (mixed into ProjectSlurmSpawner)."""

    job_network_parent = Unicode(
        "",
        config=True,
        help="""The nodes' cluster interface that multi-node jobs' containers join through
        a macvlan network (the "job network"): torch's rendezvous, gloo and NCCL connect
        between nodes on ports they pick, which a published port cannot give. Every node
        needs an interface of this name on one layer-2 network (a dedicated VLAN is best:
        docs/security.md). "" turns multi-node jobs off. Default: "" (off).
        Example: ``c.ProjectSlurmSpawner.job_network_parent = "bond0.42"``""",
    )
    job_network_subnet = Unicode(
        "",
        config=True,
        help="""The IPv4 subnet of the job network's interface (the cluster network's, as
        the nodes have it). Default: "" (none: multi-node jobs off).
        Example: ``c.ProjectSlurmSpawner.job_network_subnet = "10.42.0.0/16"``""",
    )
    job_network_range = Unicode(
        "",
        config=True,
        help="""The addresses, inside ``job_network_subnet``, that gpulab gives job
        containers (the hub assigns them, one per node of a job, and frees them when the
        job ends): a range no node, switch or DHCP server uses. Default: "" (the whole
        subnet, which is only right when the subnet serves jobs alone).
        Example: ``c.ProjectSlurmSpawner.job_network_range = "10.42.200.0/22"``""",
    )
    job_network_gateway = Unicode(
        "",
        config=True,
        help="""The job network's gateway: job containers' default route (what lies
        beyond the cluster network they reach through it, if it routes them). Never
        given to a container. Default: "" (the subnet's first address).
        Example: ``c.ProjectSlurmSpawner.job_network_gateway = "10.42.0.1"``""",
    )
    job_network_name = Unicode(
        "",
        config=True,
        help="""The Docker network name of the job network on every node's engine (the
        batch script makes it where missing). Default: "" (``<prefix>-jobnet``).
        Example: ``c.ProjectSlurmSpawner.job_network_name = "gpulab-jobnet"``""",
    )
    job_max_nodes = Int(
        4,
        config=True,
        help="""The most nodes one multi-node job may ask for (``--nodes``).
        Default: 4. Example: ``c.ProjectSlurmSpawner.job_max_nodes = 8``""",
    )
    job_max_gpus_per_node = Int(
        8,
        config=True,
        help="""The most GPUs per node a multi-node job may ask for (``--gpus-per-node``).
        Default: 8. Example: ``c.ProjectSlurmSpawner.job_max_gpus_per_node = 4``""",
    )
    job_mem_mb = Int(
        0,
        config=True,
        help="""Memory (MB) of each node's part of a multi-node job (sbatch ``--mem``, and
        the container's limit). Default: 0 (the same as a project, ``mem_mb``).
        Example: ``c.ProjectSlurmSpawner.job_mem_mb = 65536``""",
    )
    job_cpus_per_node = Int(
        0,
        config=True,
        help="""CPUs of each node's part of a multi-node job (sbatch ``--cpus-per-task``,
        and the container's limit). Default: 0 (the same as a project, ``cpus``).
        Example: ``c.ProjectSlurmSpawner.job_cpus_per_node = 16``""",
    )
    job_time_limit = Unicode(
        "",
        config=True,
        help="""Slurm time limit of a multi-node job ("90", "4:00:00", "2-00:00:00").
        Default: "" (the same as a project, ``default_time_limit``).
        Example: ``c.ProjectSlurmSpawner.job_time_limit = "1-00:00:00"``""",
    )
    job_master_port = Int(
        MASTER_PORT,
        config=True,
        help=f"""The port of torchrun's rendezvous on the first node's container
        (``--master-port``). Default: {MASTER_PORT}.
        Example: ``c.ProjectSlurmSpawner.job_master_port = 29400``""",
    )

    @validate("job_max_nodes", "job_max_gpus_per_node")
    def _check_limit(self, proposal):
        if proposal.value < 0:
            raise TraitError(f"{proposal.trait.name} cannot be negative")
        return proposal.value

    @validate("job_master_port")
    def _check_port(self, proposal):
        if not 1024 <= proposal.value <= 65535:
            raise TraitError("job_master_port must be 1024 to 65535")
        return proposal.value

    # --- what the hub's jobs API asks of the project's spawner ------------------------

    _node_image: str = ""

    def get_state(self):
        state = super().get_state()
        image = getattr(self, "image", "")
        if isinstance(image, str) and _DIGEST_REF.fullmatch(image):
            state[NODE_IMAGE] = image  # a hub that restarts still knows what the project runs
        return state

    def load_state(self, state):
        super().load_state(state)
        image = state.get(NODE_IMAGE)
        self._node_image = image if isinstance(image, str) and _DIGEST_REF.fullmatch(image) else ""

    def clear_state(self):
        super().clear_state()
        self._node_image = ""

    def get_env(self):
        env = super().get_env()
        # jobs go through the hub's API (gpulab_jupyter.jobs.cluster)
        env.update(environment.build(jobs_engine=environment.CLUSTER))
        return env

    def job_site(self):
        """The cluster as multi-node jobs see it (ClusterError where they are off)."""
        from gpulab_hub.cluster.jobs import Site

        network = self.job_network()
        if network is None:
            raise ClusterError(OFF)
        nodes = tuple(
            batch.NodeGpus(slurm_name(node, "Node"), tuple(files))
            for node, files in sorted(self.node_gpus.items())
        )
        return Site(
            cluster=self.cluster_name,
            slurm=self.slurm,
            network=network,
            limits=self.job_limits(),
            log_dir=Path(self.job_log_dir),
            mem_mb=self.job_mem_mb or self.mem_mb,
            cpus=self.job_cpus_per_node or self.cpus,
            gpus=batch.SlurmGpus(
                type=self.gpu_type,
                nodes=nodes,
                isolation=self._isolation(),
                nvidia_proc=self.node_nvidia_proc,
                dev_dir=self.node_dev_dir,
                driver_dir=self.driver_dir,
                alloc_conf=self.pytorch_cuda_alloc_conf,
            ),
            engine=batch.NodeEngine(host=self.node_docker_host, config=self.node_docker_config),
            partition=self.partition,
            time_limit=self.job_time_limit or self.default_time_limit,
            master_port=self.job_master_port,
        )

    def job_project(self):
        """Blocking: the project as its multi-node jobs run it (the image it runs now)."""
        from gpulab_hub.cluster.jobs import ProjectRef

        image = self.image if _DIGEST_REF.fullmatch(self.image or "") else self._node_image
        if not image:
            raise ClusterError(
                "The project has not run on the cluster since the hub started: start it, "
                "then start the job (its containers run the image the project runs)."
            )
        container = self.container_settings()
        self._ensure_data_folders(container)
        return ProjectRef(self.user.name, self.name, container, image)

    def job_network(self) -> JobNetwork | None:
        """The job network (checked), or None where multi-node jobs are off."""
        if not self.job_network_parent or not self.job_network_subnet:
            return None
        prefix = getattr(self, "prefix", "gpulab")
        net = JobNetwork(
            name=self.job_network_name or f"{prefix}-jobnet",
            parent=self.job_network_parent,
            subnet=self.job_network_subnet,
            ip_range=self.job_network_range,
            gateway=self.job_network_gateway,
        )
        try:
            return net.checked()
        except ClusterError as e:
            raise TraitError(str(e)) from e

    def job_limits(self) -> Limits:
        return Limits(max_nodes=self.job_max_nodes, max_gpus_per_node=self.job_max_gpus_per_node)
