"""Pure functions that turn a project's settings into Docker API arguments.

Nothing here talks to Docker: the spawner calls these and hands the result to
``docker.APIClient.create_container``, and tests compare whole dicts.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from jupyterhub.slugs import is_valid_safe_slug

from gpulab_contract import environment
from gpulab_hub.settings import DEFAULT

# Networks a project container or build must never join: "host" shares the host's
# network namespace (its loopback traffic included), "none" leaves the hub no way in.
REFUSED_NETWORKS = ("host", "none")
# The project network, wherever an engine makes it (host.ensure_network on this
# machine, a Slurm job's script on its node: cluster/batch.py): a bridge with traffic
# between containers off, so a project reaches the hub and, through NAT, the package
# index, but never another project.
NETWORK_DRIVER = "bridge"
NETWORK_OPTIONS = {"com.docker.network.bridge.enable_icc": "false"}
NETWORK_LABELS = {"gpulab.network": "projects"}

# The shared data root: ``datasets`` is filled by the admin and read-only for all.
# What a project writes (``models``, ``outputs``, its Hugging Face cache) is the
# project's (data_scope "project", the default): ``projects/<user>/<project>/<sub>``,
# mounted in that project only, so a share of one project reaches no other's data.
# Data scope "user" (the layout before, an admin's choice) mounts one folder per user
# (``<sub>/<user>``) and one cache volume per user in all of that user's projects.
DATASETS = "datasets"
PER_USER_DATA = ("models", "outputs")  # mounted at <data_mount>/<sub>
GROUPS_DATA = "groups"
PROJECT_DATA = "projects"
HF_CACHE_DATA = "huggingface"  # a project's cache folder beside its models and outputs
PROJECT_SCOPE, USER_SCOPE = "project", "user"
DATA_SCOPES = (PROJECT_SCOPE, USER_SCOPE)
# Where ``huggingface-cli login`` writes the token (huggingface_hub reads HF_TOKEN_PATH;
# its stored_tokens file goes beside it): the container's own file system, gone when
# the project stops, never the cache that other projects of the owner (user scope) or
# the project's data folders keep. Tokens that last are secrets (docs/secrets.md).
HF_TOKEN_PATH = "/tmp/gpulab-huggingface/token"

# What every project container gets, whatever its Dockerfile says: no capabilities
# and no privilege gain (setuid files in the image do nothing).
CAP_DROP = ("ALL",)
SECURITY_OPT = ("no-new-privileges",)


NO_GPU = "none"
RUNTIME = "runtime"  # NVIDIA container runtime / CDI: device_requests by UUID
DEVICES = "devices"  # explicit /dev/nvidia* nodes + the driver's libraries, read-only
WSL2 = "wsl2"  # WSL2: /dev/dxg + /usr/lib/wsl read-only, every GPU shared (gpus/wsl.py)
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
# WSL2 (gpus/wsl.py detects it): one paravirtual node for every GPU, and the Windows
# driver's Linux side; every GPU project shares every GPU.
WSL2_SHARED = "wsl2-shared"
DXG = "/dev/dxg"
WSL_DIR = "/usr/lib/wsl"  # mounted read-only into GPU projects (lib/ and drivers/)
WSL_LIB = "/usr/lib/wsl/lib"  # libcuda.so, libnvidia-ml.so, nvidia-smi


@dataclass(frozen=True)
class GpuAssignment:
    """The devices a project holds and how its container is given them."""

    uuids: tuple[str, ...] = ()
    minors: tuple[int, ...] = ()  # /dev/nvidia<minor> of each GPU (explicit-devices path)
    isolation: str = NO_GPU
    driver_dir: str = DEFAULT.gpus.driver_dir  # host folder with the driver's lib64/, bin/
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


def wsl2_env(alloc_conf: str) -> dict[str, str]:
    """WSL2: every GPU is visible (nothing narrower can be given); the libraries from
    WSL_LIB."""
    return {
        "NVIDIA_VISIBLE_DEVICES": "all",
        "PYTORCH_CUDA_ALLOC_CONF": alloc_conf,
        "LD_LIBRARY_PATH": WSL_LIB,
        "GPULAB_GPU_SHARING": WSL2_SHARED,
    }


def wsl2_host_config() -> dict:
    """WSL2: the paravirtual GPU node, read-write as CUDA needs it."""
    return {"devices": [f"{DXG}:{DXG}:rwm"]}


def wsl2_binds() -> dict[str, dict[str, str]]:
    """WSL2: the Windows driver's Linux side, read-only."""
    return {WSL_DIR: {"bind": WSL_DIR, "mode": "ro"}}


def gpu_env(g: GpuAssignment) -> dict[str, str]:
    """Visible-device variables that agree with what the container is given."""
    if g.isolation == WSL2:
        return wsl2_env(g.alloc_conf)
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
    if g.isolation == WSL2:
        return wsl2_host_config()
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
class ContainerInputs:
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
    owner: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    user: str = "1000:100"  # uid:gid the container runs as (the image's notebook user)
    workspace: str = "/workspace"
    data_mount: str = "/data"
    hf_cache_mount: str = "/cache/huggingface"
    shm_size: str = "8g"
    mem_limit: int | None = None
    cpu_limit: float | None = None
    pids_limit: int | None = None
    data_scope: str = PROJECT_SCOPE  # USER_SCOPE: the old per-user folders and cache
    data_read_all: bool = False  # every user's models/outputs readable under /data/all
    data_groups: tuple[str, ...] = ()  # data groups this user belongs to (/data/groups/<g>)
    gpus: GpuAssignment = GpuAssignment()


_GROUP = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def valid_group(name: str) -> bool:
    """A JupyterHub group name usable as a data folder name (full match)."""
    return _GROUP.fullmatch(name) is not None and ".." not in name


def group_folder(name: str) -> str | None:
    """The data folder's name of the JupyterHub group ``name``; None where it has none.

    A plain name is its own (``vision-lab``). A full group path, as Keycloak's group
    mapper sends it (``/staff/gpu-team``), is its parts joined by ``+`` after a ``+``
    (``+staff+gpu-team``): never a plain name's (they hold no ``+``) nor another path's,
    so ``/staff/gpu-team`` and ``/students/gpu-team`` keep two folders, and a folder is
    never inside another group's."""
    if valid_group(name):
        return name
    parts = name.split("/")
    if len(parts) > 1 and parts[0] == "" and all(valid_group(p) for p in parts[1:]):
        folder = "+" + "+".join(parts[1:])
        return folder if len(folder) <= 255 else None
    return None


def project_data_dir(s: ContainerInputs) -> str:
    """``<data_root>/projects/<owner>/<project>``: the project's data (scope "project"),
    named as its project folder ``<projects_root>/<owner>/<project>`` is."""
    project = os.path.basename(s.project_dir.rstrip("/"))
    if not is_valid_safe_slug(project):
        raise ValueError(f"the project folder {s.project_dir!r} does not end in a project name")
    if s.owner in (".", "..") or "/" in s.owner or "\0" in s.owner:
        raise ValueError(f"the user name {s.owner!r} cannot name a data folder")
    return f"{s.data_root}/{PROJECT_DATA}/{s.owner}/{project}"


def data_scope(s: ContainerInputs) -> str:
    if s.data_scope not in DATA_SCOPES:
        raise ValueError(f"data_scope {s.data_scope!r}: {' or '.join(DATA_SCOPES)}")
    return s.data_scope


def _written(s: ContainerInputs) -> tuple[str, str, str]:
    """(models, outputs, Hugging Face cache) of this container: host folders, or in
    scope "user" the user's cache volume."""
    if not s.owner:
        raise ValueError("a project container needs its owner (its data folders)")
    if data_scope(s) == PROJECT_SCOPE:
        mine = project_data_dir(s)
        return f"{mine}/models", f"{mine}/outputs", f"{mine}/{HF_CACHE_DATA}"
    return f"{s.data_root}/models/{s.owner}", f"{s.data_root}/outputs/{s.owner}", s.hf_cache_volume


def data_folders(s: ContainerInputs) -> list[str]:
    """Host folders under the data root that the container writes: the hub makes each
    (its parents the hub's own) and gives it to the notebook user (datafolders.ensure)."""
    models, outputs, cache = _written(s)
    folders = [models, outputs] + ([cache] if s.data_scope == PROJECT_SCOPE else [])
    return folders + [f"{s.data_root}/{GROUPS_DATA}/{g}" for g in s.data_groups]


def volume_binds(s: ContainerInputs) -> dict[str, dict[str, str]]:
    """Host path or volume name -> {"bind": container path, "mode": rw|ro}."""
    models, outputs, cache = _written(s)
    binds = {s.project_dir: {"bind": s.workspace, "mode": "rw"}}
    binds[f"{s.data_root}/{DATASETS}"] = {"bind": f"{s.data_mount}/{DATASETS}", "mode": "ro"}
    for sub, mine in zip(PER_USER_DATA, (models, outputs), strict=True):
        binds[mine] = {"bind": f"{s.data_mount}/{sub}", "mode": "rw"}
        if s.data_read_all:
            everyone = f"{s.data_root}/{sub}"
            binds[everyone] = {"bind": f"{s.data_mount}/all/{sub}", "mode": "ro"}
    for g in s.data_groups:
        path = f"{s.data_root}/{GROUPS_DATA}/{g}"
        binds[path] = {"bind": f"{s.data_mount}/{GROUPS_DATA}/{g}", "mode": "rw"}
    binds[cache] = {"bind": s.hf_cache_mount, "mode": "rw"}
    if s.gpus.uuids and s.gpus.isolation == DEVICES:
        binds[s.gpus.driver_dir] = {"bind": s.gpus.driver_dir, "mode": "ro"}
    if s.gpus.isolation == WSL2:
        binds.update(wsl2_binds())
    return binds


def container_env(s: ContainerInputs) -> dict[str, str]:
    """The spawner's environment plus what gpulab adds for every project."""
    env = dict(s.env)
    env.update(environment.build(workspace=s.workspace, data=s.data_mount))
    env.update({"HF_HOME": s.hf_cache_mount, "HF_TOKEN_PATH": HF_TOKEN_PATH})
    env.update(gpu_env(s.gpus))
    return env


def check_network(network: str) -> str:
    """``network`` if a project container or build may join it, else ValueError."""
    if not network or network in REFUSED_NETWORKS:
        raise ValueError(
            f"Project containers and builds cannot use the Docker network {network!r}: "
            "gpulab runs them on a bridge network of its own (GPULAB_NETWORK names it)."
        )
    return network


def host_config(s: ContainerInputs) -> dict:
    """Keyword arguments for ``APIClient.create_host_config``.

    On the bridge network the hub reaches the server by container IP; nothing
    is published on the host.
    """
    config: dict = {
        "binds": volume_binds(s),
        "network_mode": check_network(s.network),
        "port_bindings": {},
        "shm_size": s.shm_size,
        "cap_drop": list(CAP_DROP),
        "security_opt": list(SECURITY_OPT),
    }
    config.update(gpu_host_config(s.gpus))
    if s.pids_limit is not None:
        config["pids_limit"] = s.pids_limit
    if s.mem_limit is not None:
        config["mem_limit"] = s.mem_limit
    if s.cpu_limit is not None:
        config["cpu_period"] = 100_000
        config["cpu_quota"] = int(s.cpu_limit * 100_000)
    return config


# One DNS label (RFC 1123): what a container's hostname may be.
_HOSTNAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


def container_hostname(s: ContainerInputs) -> str | None:
    """The container's hostname: its project's name (the last part of the project
    folder, ``first``), so a terminal's prompt reads ``jovyan@first`` instead of a
    container ID; None (Docker's own) where that is no project name."""
    project = os.path.basename(s.project_dir.rstrip("/"))
    if not is_valid_safe_slug(project) or _HOSTNAME.fullmatch(project) is None:
        return None
    return project


def container_spec(s: ContainerInputs) -> dict:
    """Keyword arguments for ``APIClient.create_container``.

    ``host_config`` is left as plain keyword arguments; the caller passes it
    through ``create_host_config`` (which only validates and renames).
    """
    spec = {
        "name": s.name,
        "hostname": container_hostname(s),
        "image": s.image,
        "command": list(s.command),
        "environment": container_env(s),
        "labels": dict(s.labels),
        "user": s.user,
        "working_dir": s.workspace,
        "volumes": sorted(b["bind"] for b in volume_binds(s).values()),
        "ports": {f"{s.port}/tcp": None},
        "host_config": host_config(s),
    }
    if spec["hostname"] is None:
        del spec["hostname"]
    return spec


def userns_offset(docker_info: dict) -> tuple[int, int]:
    """(uid, gid) that Docker's user-namespace remapping adds to container ids.

    With ``userns-remap`` the engine's data root ends in ``<uid>.<gid>`` of the
    remapped range (e.g. /var/lib/docker/100000.100000); without it, (0, 0).
    """
    if not any("userns" in o for o in docker_info.get("SecurityOptions") or []):
        return 0, 0
    last = os.path.basename(str(docker_info.get("DockerRootDir", "")).rstrip("/"))
    uid, dot, gid = last.partition(".")
    if dot and uid.isdigit() and gid.isdigit():
        return int(uid), int(gid)
    raise ValueError(
        f"Docker reports user-namespace remapping but its data root {last!r} does not "
        "name the remapped range"
    )
