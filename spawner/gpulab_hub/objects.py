"""Pure functions that turn a project's settings into Docker API arguments.

Nothing here talks to Docker: the spawner calls these and hands the result to
``docker.APIClient.create_container``, and tests compare whole dicts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

HOST_NETWORK = "host"

# Sub-folders of the shared data root and how they are mounted under /data.
DATA_MOUNTS = (("datasets", "ro"), ("models", "rw"), ("outputs", "rw"))


NO_GPU = "none"
RUNTIME = "runtime"  # NVIDIA container runtime / CDI: device_requests by UUID
DEVICES = "devices"  # explicit /dev/nvidia* nodes + the driver's libraries, read-only
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


@dataclass(frozen=True)
class GpuAssignment:
    """The devices a project holds and how its container is given them."""

    uuids: tuple[str, ...] = ()
    minors: tuple[int, ...] = ()  # /dev/nvidia<minor> of each GPU (explicit-devices path)
    isolation: str = NO_GPU
    driver_dir: str = "/usr/local/nvidia"  # host folder with the driver's lib64/ and bin/
    alloc_conf: str = "expandable_segments:True"  # PYTORCH_CUDA_ALLOC_CONF


def detect_isolation(docker_info: dict, dev_dir: str = "/dev") -> str:
    """How this host can give a container GPUs: runtime, devices, or none."""
    runtimes = docker_info.get("Runtimes") or {}
    if "nvidia" in runtimes or docker_info.get("CDISpecDirs") and _has_cdi_nvidia(docker_info):
        return RUNTIME
    if os.path.exists(os.path.join(dev_dir, "nvidiactl")):
        return DEVICES
    return NO_GPU


def _has_cdi_nvidia(docker_info: dict) -> bool:
    for d in docker_info.get("CDISpecDirs") or []:
        if os.path.isdir(d) and any("nvidia" in f for f in os.listdir(d)):
            return True
    return False


def gpu_env(g: GpuAssignment) -> dict[str, str]:
    """Visible-device variables that agree with what the container is given."""
    if not g.uuids:
        # "void": the NVIDIA runtime adds nothing, even if the image says "all".
        return {"NVIDIA_VISIBLE_DEVICES": "void", "CUDA_VISIBLE_DEVICES": ""}
    ids = ",".join(g.uuids)
    env = {
        "NVIDIA_VISIBLE_DEVICES": ids,
        "CUDA_VISIBLE_DEVICES": ids,
        "PYTORCH_CUDA_ALLOC_CONF": g.alloc_conf,
    }
    if g.isolation == DEVICES:
        env["LD_LIBRARY_PATH"] = f"{g.driver_dir}/lib64"
    return env


def gpu_host_config(g: GpuAssignment) -> dict:
    """host_config entries that give the container exactly its devices."""
    if not g.uuids:
        return {}
    if g.isolation == RUNTIME:
        return {
            "device_requests": [
                {
                    "driver": "nvidia",
                    "device_ids": list(g.uuids),
                    "capabilities": [["gpu", "compute", "utility"]],
                }
            ]
        }
    if g.isolation == DEVICES:
        nodes = [f"/dev/nvidia{m}" for m in g.minors] + list(CONTROL_DEVICES)
        return {"devices": [f"{n}:{n}:rwm" for n in nodes]}
    raise ValueError(f"GPUs assigned but no way to give them to a container ({g.isolation!r})")


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
    gpus: GpuAssignment = GpuAssignment()


def volume_binds(s: ContainerSettings) -> dict[str, dict[str, str]]:
    """Host path or volume name -> {"bind": container path, "mode": rw|ro}."""
    binds = {s.project_dir: {"bind": s.workspace, "mode": "rw"}}
    for sub, mode in DATA_MOUNTS:
        binds[f"{s.data_root}/{sub}"] = {"bind": f"{s.data_mount}/{sub}", "mode": mode}
    binds[s.hf_cache_volume] = {"bind": s.hf_cache_mount, "mode": "rw"}
    if s.gpus.uuids and s.gpus.isolation == DEVICES:
        binds[s.gpus.driver_dir] = {"bind": s.gpus.driver_dir, "mode": "ro"}
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
    env.update(gpu_env(s.gpus))
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
    config.update(gpu_host_config(s.gpus))
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
