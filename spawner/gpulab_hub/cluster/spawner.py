"""ProjectSlurmSpawner: each project's container runs as a Slurm job, on the node and
with the GPUs Slurm gives it (docs/cluster.md).

A start is ProjectSpawner's up to the image (the same checks of the project, its
options and its display name, the same build and last good image, the same failure
pages); then the image goes to the cluster's registry, the batch script (batch.py:
the one-machine container spec, the node's engine, the image by digest, the port
published on the node's cluster address) is submitted with sbatch, and the spawn page
shows the queue's words until the job runs and its script says where the container
listens (watch.py). Stop cancels the job (its trap, or the cluster's Epilog, removes
the container); poll asks squeue. The job's id is the spawner's state.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import threading
import time
from dataclasses import replace
from html import escape
from pathlib import Path
from urllib.parse import urlparse

from traitlets import default

from gpulab_contract import environment
from gpulab_hub.cluster import (
    ClusterError,
    batch,
    gres_type,
    nodefirewall,
    registry,
    slurm_name,
    watch,
)
from gpulab_hub.cluster.joblog import JobLog
from gpulab_hub.cluster.jobtraits import MultiNodeJobTraits
from gpulab_hub.cluster.slurm import Node, Slurm
from gpulab_hub.cluster.traits import ClusterTraits
from gpulab_hub.images.startfail import SpawnError
from gpulab_hub.projects import objects, options, project_name
from gpulab_hub.spawner import ProjectSpawner

# squeue states of a job whose project is up (or about to be).
LIVE = ("PENDING", "CONFIGURING", "RUNNING", "SUSPENDED")
NODES_TTL = 60.0  # seconds a read of sinfo serves the spawn form
STOP_WAIT = 60.0  # seconds stop waits for a cancelled job to leave Slurm's active states
_nodes_cache: dict[tuple[str, str], tuple[float, list[Node]]] = {}
_nodes_lock = threading.Lock()
# The project server's list of peers it answers (gpulab_jupyter.hubpeers reads it).


def cluster_nodes(client: Slurm, fresh: bool = False) -> list[Node]:
    """Blocking: sinfo's nodes, read at most every NODES_TTL seconds unless ``fresh``."""
    key = (client.conf, client.path)
    now = time.monotonic()
    with _nodes_lock:
        cached = _nodes_cache.get(key)
        if cached and not fresh and now - cached[0] < NODES_TTL:
            return cached[1]
    nodes = client.nodes()
    with _nodes_lock:
        _nodes_cache[key] = (now, nodes)
    return nodes


def node_ipv4(node: Node) -> str | None:
    """The IPv4 address of a node's NodeAddr (a literal, else resolved here)."""
    return ipv4_of(node.address or node.name)


def ipv4_of(name: str) -> str | None:
    """Blocking: ``name`` as an IPv4 address (a literal, else resolved here)."""
    if not name:
        return None
    try:
        return str(ipaddress.IPv4Address(name))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return None
    return infos[0][4][0] if infos else None


class ProjectSlurmSpawner(MultiNodeJobTraits, ClusterTraits, ProjectSpawner):
    """Spawn each project (named server) as a Slurm job running its container."""

    job_id: int | None = None

    @default("job_log_dir")
    def _default_job_log_dir(self):
        return str(Path(self.state_root) / "cluster-jobs")

    @property
    def slurm(self) -> Slurm:
        return Slurm(conf=self.slurm_conf, path=self.slurm_path)

    # --- state ---------------------------------------------------------------------

    def get_state(self):
        state = super().get_state()
        if self.job_id:
            state["slurm_job"] = self.job_id
        return state

    def load_state(self, state):
        super().load_state(state)
        job = state.get("slurm_job")
        ok = isinstance(job, int) and not isinstance(job, bool) and 0 < job < 10**12
        self.job_id = job if ok else None

    def clear_state(self):
        super().clear_state()
        self.job_id = None

    def _save_state(self) -> None:
        """The job id in the hub's database at once: a hub that restarts while the job
        waits still knows (and can cancel) it."""
        if self.orm_spawner is not None:
            self.orm_spawner.state = self.get_state()
            self.user.db.commit()

    # --- GPUs: what the cluster has, from sinfo ----------------------------------------

    def cluster_max_gpus(self, gpu_type: str) -> int:
        """Blocking: the most GPUs (of ``gpu_type``) one node has, over the nodes that
        take jobs; 0 when none has any (or Slurm does not answer)."""
        try:
            nodes = cluster_nodes(self.slurm)
        except ClusterError as e:
            self.log.warning("gpulab: sinfo failed, the spawn form offers no GPUs: %s", e)
            return 0
        return max((n.gpus(gpu_type) for n in nodes if n.usable), default=0)

    def gpu_choices(self) -> options.GpuChoices | None:
        most = self.cluster_max_gpus(self.gpu_type)
        if self.gpu_allowed_types:
            most = max([most, *(self.cluster_max_gpus(t) for t in self.gpu_allowed_types)])
        if not most:
            return None
        limit = min(most, self.gpu_max_per_project or most)
        return options.GpuChoices(
            max_count=limit,
            default_count=min(self.default_gpus, limit),
            types=tuple(self.gpu_allowed_types),
        )

    def _gpu_request(self, opts: dict) -> tuple[int, str]:
        """Blocking: (GPUs, GRES type) of this start, checked against the cluster."""
        if opts.get("mig_profile"):
            raise options.OptionsError(
                "MIG slices are not offered on the cluster; ask for whole GPUs."
            )
        kind = self.gpu_type
        if opts.get("gpu_type"):
            if opts["gpu_type"] not in self.gpu_allowed_types:
                offered = ", ".join(self.gpu_allowed_types) or "none"
                raise options.OptionsError(
                    f"GPU type {opts['gpu_type']!r} is not one this hub offers ({offered})."
                )
            kind = opts["gpu_type"]
        if kind:
            gres_type(kind)
        most = self.cluster_max_gpus(kind)
        limit = min(most, self.gpu_max_per_project or most)
        count = opts.get("gpus", min(self.default_gpus, limit))
        if count > limit:
            what = f" {kind}" if kind else ""
            raise options.OptionsError(
                f"This project asks for {count}{what} GPU(s); on this cluster a project can "
                f"have at most {limit}. Start it with fewer."
            )
        if count and not self.node_gpus:
            raise ClusterError(
                "The hub does not know the GPU device files of the cluster's nodes "
                "(c.ProjectSlurmSpawner.node_gpus), so GPU projects cannot start. Start "
                "this one with 0 GPUs, or ask the administrator (docs/cluster.md)."
            )
        return count, kind

    # --- where the hub and the containers reach each other ---------------------------

    def _hub_url_for_nodes(self) -> str:
        """The base URL project containers on the nodes reach the hub's API at."""
        if self.hub_address_for_nodes:
            where = self.hub_address_for_nodes
            address, _, port = where.rpartition(":") if ":" in where else (where, "", "")
            port = port or str(self.hub.port)
            if not port.isdigit() or not address or any(c in address for c in "/@?#[] "):
                raise ClusterError(
                    f"hub_address_for_nodes {where!r} is not an address or address:port"
                )
            return f"{urlparse(self.hub.api_url).scheme}://{address}:{port}"
        api = urlparse(self.hub.api_url)
        if api.hostname in ("127.0.0.1", "localhost", "::1"):
            raise ClusterError(
                f"The hub's API listens on {api.hostname}, which project containers on the "
                "cluster's nodes cannot reach. Ask the administrator to set GPULAB_HUB_IP to "
                "this machine's address on the cluster network, or "
                "c.ProjectSlurmSpawner.hub_address_for_nodes (docs/cluster.md)."
            )
        return f"{api.scheme}://{api.netloc}"

    def _hub_peers(self) -> str:
        """Blocking (may resolve a name): GPULAB_HUB_PEERS, the addresses the hub and its
        proxy connect to the nodes from; the project's server answers no other peer."""
        if self.hub_peer_addresses:
            peers = []
            for value in self.hub_peer_addresses:
                try:
                    peers.append(str(ipaddress.IPv4Address(value)))
                except ValueError:
                    raise ClusterError(
                        f"hub_peer_addresses holds {value!r}, not an IPv4 address"
                    ) from None
            return ",".join(peers)
        host = urlparse(self._hub_url_for_nodes()).hostname or ""
        address = ipv4_of(host)
        if address is None or ipaddress.IPv4Address(address).is_unspecified:
            raise ClusterError(
                f"The hub's address for the nodes ({host}) is no IPv4 address the hub "
                "connects from, so project servers could not tell the hub from other "
                "projects. Set c.ProjectSlurmSpawner.hub_peer_addresses (docs/cluster.md)."
            )
        return address

    def get_env(self):
        if not self.trait_has_value("hub_connect_url") or self.hub_connect_url is None:
            self.hub_connect_url = self._hub_url_for_nodes()
        env = super().get_env()
        env.update(environment.build(hub_peers=self._hub_peers()))
        return env

    def _node_addresses(self) -> dict[str, str]:
        """Blocking: each node's cluster address (sinfo's NodeAddr, as IPv4)."""
        found = {}
        for node in cluster_nodes(self.slurm, fresh=True):
            address = node_ipv4(node)
            if address is None:
                self.log.warning("gpulab: node %s's address %r does not resolve to IPv4",
                                 node.name, node.address)  # fmt: skip
            else:
                found[node.name] = address
        if not found:
            raise ClusterError("The cluster lists no node with an address the hub can use")
        return found

    # --- start -----------------------------------------------------------------------

    def container_settings(self) -> objects.ContainerInputs:
        """The one-machine container, limited to what the job asked Slurm for (the
        container lives outside the job's cgroup: its own limits hold it)."""
        s = super().container_settings()
        return replace(s, mem_limit=self.mem_mb * 2**20, cpu_limit=float(self.cpus))

    def _job_log_folder(self) -> Path:
        """Blocking: the hub-owned folder of job outputs, and this project's old ones gone."""
        folder = Path(self.job_log_dir)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        mine = re.compile(re.escape(self.container_name) + r"-[0-9]{1,12}\.log")
        for entry in os.scandir(folder):
            if mine.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
        return folder

    def _isolation(self) -> str:
        if self.gpu_isolation in ("auto", objects.RUNTIME):
            return objects.RUNTIME
        if self.gpu_isolation == objects.DEVICES:
            return objects.DEVICES
        raise ClusterError(f"gpu_isolation {self.gpu_isolation!r}: runtime, devices or auto")

    def _batch_job(self, count: int, addresses: dict[str, str]) -> batch.BatchJob:
        nodes = tuple(
            batch.NodeGpus(slurm_name(node, "Node"), tuple(files))
            for node, files in sorted(self.node_gpus.items())
        )
        gpus = batch.SlurmGpus(
            count=count,
            nodes=nodes if count else (),
            isolation=self._isolation(),
            nvidia_proc=self.node_nvidia_proc,
            dev_dir=self.node_dev_dir,
            driver_dir=self.driver_dir,
            alloc_conf=self.pytorch_cuda_alloc_conf,
        )
        return batch.BatchJob(
            cluster=self.cluster_name,
            container=self.container_settings(),
            gpus=gpus,
            engine=batch.NodeEngine(
                host=self.node_docker_host, config=self.node_docker_config, pull=True,
                network=True,
            ),  # fmt: skip
            publish=tuple(batch.NodeAddress(n, a) for n, a in sorted(addresses.items())),
        )

    async def _push(self) -> str:
        """The prepared image (``self.image``) in the registry; the reference nodes pull."""
        if not self.registry:
            raise ClusterError(
                "The hub has no registry for the cluster (c.ProjectSlurmSpawner.registry), "
                "so the project's image cannot reach the nodes. Ask the administrator "
                "(docs/cluster.md)."
            )
        self._emit(72, "Sending the image to the cluster's registry")
        shown = registry.PushProgress(lambda words: self._emit(75, words))
        started = time.monotonic()
        digest = await self._run(registry.push, self._docker, self.image, self.registry, shown)
        took = time.monotonic() - started
        self._emit(78, f"The image is in the cluster's registry ({took:.0f} s)")
        return registry.node_reference(self.registry_for_nodes or self.registry, self.image, digest)

    async def _launch(self, opts: dict):
        try:
            return await self._submit_and_wait(opts)
        except watch.JobFailed as e:
            raise job_failed(str(e), e.lines) from e
        except ClusterError as e:
            raise SpawnError(str(e), reason="cluster", status_code=503) from e

    async def _submit_and_wait(self, opts: dict):
        count, kind = await self._run(self._gpu_request, opts)
        self.image = await self._push()
        self._hub_url_for_nodes()  # refused before anything is submitted
        addresses = await self._run(self._node_addresses)
        # the hub's address is what a server trusts: no build here may use it on a node
        await self._run(nodefirewall.keep_builds_off, addresses.values())
        job = self._batch_job(count, addresses)
        await self._run(self._ensure_data_folders, job.container)
        script = batch.render_script(job)
        folder = await self._run(self._job_log_folder)
        request = batch.JobRequest(
            name=self.container_name, mem_mb=self.mem_mb, cpus=self.cpus, gpus=count,
            gpu_type=kind if count else "", partition=self.partition,
            time_limit=self.default_time_limit,
            output=str(folder / f"{self.container_name}-%j.log"),
        )  # fmt: skip
        args = batch.sbatch_args(request)
        self._emit(80, "Sending the project's job to the cluster")
        self.job_id = await self._run(self.slurm.submit, script, args)
        self._save_state()
        log = JobLog(folder / f"{self.container_name}-{self.job_id}.log")
        try:
            ready = await watch.wait_ready(
                self.slurm, self.job_id, log, addresses, project=project_name(self.name),
                emit=self._emit, run=self._run, queue_timeout=self.queue_timeout,
            )  # fmt: skip
        except BaseException:
            # a failed or interrupted start (the user stopped it, a timeout) ends its job
            await self._run(self._cancel, self.job_id)
            raise
        self._emit(95, f"The project listens on {ready.address}:{ready.port}; connecting")
        return ready.address, ready.port

    # --- stop and poll ---------------------------------------------------------------

    def _cancel(self, job_id: int) -> None:
        """Blocking: scancel, whatever the job's state (a job that ended is fine)."""
        try:
            self.slurm.cancel(job_id)
        except ClusterError as e:
            self.log.info("gpulab: scancel of job %s: %s", job_id, e)

    def _cancel_and_wait(self, job_id: int, timeout: float = STOP_WAIT) -> None:
        """Blocking: cancel, then wait (bounded) until the job leaves Slurm's active
        states; the trap and the Epilog have removed its container by then."""
        self._cancel(job_id)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                job = self.slurm.job(job_id)
            except ClusterError as e:
                self.log.warning("gpulab: squeue after scancel of job %s: %s", job_id, e)
                job = None
            if job is None or job.state not in (*LIVE, "COMPLETING"):
                return
            time.sleep(0.5)
        self.log.warning("gpulab: job %s still %s %.0f s after scancel", job_id, job.state,
                         timeout)  # fmt: skip

    async def stop(self, now=False):
        if self.job_id:
            await self._run(self._cancel_and_wait, self.job_id)
        self.clear_state()

    async def poll(self):
        """None while the project's job waits or runs; else its end (a job Slurm has
        forgotten has stopped). A Slurm that does not answer stops nothing."""
        if not self.job_id:
            return 0
        try:
            job = await self._run(self.slurm.job, self.job_id)
        except ClusterError as e:
            self.log.warning("gpulab: squeue for job %s failed: %s", self.job_id, e)
            return None
        if job is not None and job.state in LIVE:
            return None
        return 0 if job is None or job.state == "COMPLETED" else 1


def job_failed(message: str, lines: tuple[str, ...]) -> SpawnError:
    """A failed start, with the container's last lines (quoted by the script) below."""
    err = SpawnError(message, reason="cluster")
    if lines:
        tail = "\n".join(lines)
        err.jupyterhub_message += "\nThe container's last lines:\n" + tail
        err.jupyterhub_html_message += (
            "<p>The container's last lines:</p>"
            f'<pre class="gpulab-log-tail">{escape(tail)}</pre>'
        )
    return err

