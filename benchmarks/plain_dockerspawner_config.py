# JupyterHub configuration of the benchmark's baseline hub (benchmarks/spawn.py):
# gpulab's site settings (ports, database, authenticator; GPULAB_* variables),
# but a plain DockerSpawner on a user-defined bridge network, the way
# DockerSpawner's documentation sets it up (the hub reaches each server by its
# container IP), running the image given in GPULAB_BENCH_IMAGE.
import os
from pathlib import Path

from gpulab_hub import settings

env = settings.with_hub_ip(os.environ)
c = get_config()  # noqa: F821 (provided by JupyterHub)
settings.apply(c, env, images_dir=Path(__file__).resolve().parents[1] / "images")
c.JupyterHub.spawner_class = "dockerspawner.DockerSpawner"
c.DockerSpawner.image = os.environ["GPULAB_BENCH_IMAGE"]
c.DockerSpawner.prefix = os.environ["GPULAB_CONTAINER_PREFIX"]
c.DockerSpawner.network_name = settings.network_name(settings.site(env))
c.DockerSpawner.remove = True
c.DockerSpawner.pull_policy = "never"
c.DockerSpawner.cmd = ["jupyterhub-singleuser"]
