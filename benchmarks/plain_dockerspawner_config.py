# JupyterHub configuration of the benchmark's baseline hub (benchmarks/spawn.py):
# gpulab's site settings (ports, database, authenticator; GPULAB_* variables),
# but a plain DockerSpawner on a user-defined bridge network, the way
# DockerSpawner's documentation sets it up (the hub reaches each server by its
# container IP), running the image given in GPULAB_BENCH_IMAGE.
import os
from pathlib import Path

from gpulab_hub import hubconfig, settings

site = hubconfig.with_hub_ip(settings.parse(os.environ))
c = get_config()  # noqa: F821 (provided by JupyterHub)
hubconfig.apply(c, site, images_dir=Path(__file__).resolve().parents[1] / "images")
c.JupyterHub.spawner_class = "dockerspawner.DockerSpawner"
c.DockerSpawner.image = os.environ["GPULAB_BENCH_IMAGE"]
c.DockerSpawner.prefix = site.prefix
c.DockerSpawner.network_name = site.network_name
c.DockerSpawner.remove = True
c.DockerSpawner.pull_policy = "never"
c.DockerSpawner.cmd = ["jupyterhub-singleuser"]
