"""Pure functions that turn a project's settings into Docker API arguments.

Nothing here talks to Docker: the spawner calls these and hands the result to
``docker.APIClient.create_container``, and tests compare whole dicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

HOST_NETWORK = "host"

# Sub-folders of the shared data root and how they are mounted under /data.
DATA_MOUNTS = (("datasets", "ro"), ("models", "rw"), ("outputs", "rw"))


@dataclass(frozen=True)
class ContainerSettings:
    """Everything the container spec depends on, in one place."""

    name: str
    image: str
    command: list[str]
    env: dict[str, str]
    project_dir: str
    data_root: str
    hf_cache_volume: str
    network: str
    port: int
    labels: dict[str, str] = field(default_factory=dict)
    workspace: str = "/workspace"
    data_mount: str = "/data"
    hf_cache_mount: str = "/cache/huggingface"
    shm_size: str = "8g"
    mem_limit: int | None = None
    cpu_limit: float | None = None


def volume_binds(s: ContainerSettings) -> dict[str, dict[str, str]]:
    """Host path or volume name -> {"bind": container path, "mode": rw|ro}."""
    binds = {s.project_dir: {"bind": s.workspace, "mode": "rw"}}
    for sub, mode in DATA_MOUNTS:
        binds[f"{s.data_root}/{sub}"] = {"bind": f"{s.data_mount}/{sub}", "mode": mode}
    binds[s.hf_cache_volume] = {"bind": s.hf_cache_mount, "mode": "rw"}
    return binds


def container_env(s: ContainerSettings) -> dict[str, str]:
    """The spawner's environment plus what gpulab adds for every project."""
    env = dict(s.env)
    env.update(
        {
            "GPULAB_WORKSPACE": s.workspace,
            "GPULAB_PROJECT_DIR": s.workspace,
            "GPULAB_DATA": s.data_mount,
            "HF_HOME": s.hf_cache_mount,
        }
    )
    return env


def host_config(s: ContainerSettings) -> dict:
    """Keyword arguments for ``APIClient.create_host_config``."""
    config: dict = {
        "binds": volume_binds(s),
        "network_mode": s.network,
        "shm_size": s.shm_size,
    }
    if s.network != HOST_NETWORK:
        # On a user-defined network the hub reaches the server by container IP;
        # nothing is published on the host.
        config["port_bindings"] = {}
    if s.mem_limit is not None:
        config["mem_limit"] = s.mem_limit
    if s.cpu_limit is not None:
        config["cpu_period"] = 100_000
        config["cpu_quota"] = int(s.cpu_limit * 100_000)
    return config


def container_spec(s: ContainerSettings) -> dict:
    """Keyword arguments for ``APIClient.create_container``.

    ``host_config`` is left as plain keyword arguments; the caller passes it
    through ``create_host_config`` (which only validates and renames).
    """
    spec = {
        "name": s.name,
        "image": s.image,
        "command": list(s.command),
        "environment": container_env(s),
        "labels": dict(s.labels),
        "working_dir": s.workspace,
        "volumes": sorted(b["bind"] for b in volume_binds(s).values()),
        "host_config": host_config(s),
    }
    if s.network != HOST_NETWORK:
        spec["ports"] = {f"{s.port}/tcp": None}
    return spec
