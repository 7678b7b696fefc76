# JupyterHub configuration of the benchmark's baseline hub (benchmarks/spawn.py):
# gpulab's site settings (ports, database, authenticator; GPULAB_* variables),
# but a plain DockerSpawner set up for host networking the way DockerSpawner's
# documentation says, running the image given in GPULAB_BENCH_IMAGE.
import os
from pathlib import Path

from dockerspawner import DockerSpawner
from jupyterhub.utils import random_port

from gpulab_hub import settings


class PlainDockerSpawner(DockerSpawner):
    """DockerSpawner on the host network: each server on its own loopback port."""

    async def start(self):
        self.port = random_port()
        return await super().start()

    async def get_ip_and_port(self):
        # As DockerSpawner.get_ip_and_port's docstring says for network_mode=host.
        return self.host_ip, self.port


c = get_config()  # noqa: F821 (provided by JupyterHub)
settings.apply(c, os.environ, images_dir=Path(__file__).resolve().parents[1] / "images")
c.JupyterHub.spawner_class = PlainDockerSpawner
c.DockerSpawner.image = os.environ["GPULAB_BENCH_IMAGE"]
c.DockerSpawner.prefix = os.environ["GPULAB_CONTAINER_PREFIX"]
c.DockerSpawner.network_name = "host"
c.DockerSpawner.host_ip = "127.0.0.1"
# With use_internal_ip False, DockerSpawner adds port_bindings, which Docker
# refuses on the host network ("host" network_mode is incompatible with
# port_bindings, jupyterhub/dockerspawner#462); get_ip_and_port above ignores it.
c.DockerSpawner.use_internal_ip = True
c.DockerSpawner.ip = "127.0.0.1"
c.DockerSpawner.remove = True
c.DockerSpawner.pull_policy = "never"
c.DockerSpawner.cmd = ["jupyterhub-singleuser"]
