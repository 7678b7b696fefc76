"""The project container spec (projects/objects.container_spec) as ``docker run``
arguments, for a batch script that starts the container on a Slurm node.

The spec stays the one source of the container's protections: this module only
translates it, refuses any key it does not know (a protection added to the spec
later must be taught here, never dropped), and validates every value it writes
by full match. Environment values never go on a command line: they are handed to
``docker run --env-file /dev/stdin`` (batch.py), so ``ps`` on the node shows names
and paths only, never the project's token.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpulab_hub.cluster import ClusterError

_CONTAINER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_HOSTNAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")  # one DNS label
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}")
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_LABEL_KEY = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
_HOST_PATH = re.compile(r"/[A-Za-z0-9._@+=/-]{0,1023}")
_VOLUME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_CONTAINER_PATH = re.compile(r"/[A-Za-z0-9._@+=/-]{0,1023}")
_USER = re.compile(r"[0-9]{1,10}(:[0-9]{1,10})?")
_SIZE = re.compile(r"[0-9]{1,15}[bkmgBKMG]?")
_PORT = re.compile(r"[0-9]{1,5}/(tcp|udp)")
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.=:-]{0,127}")  # cap names, security options
_DEVICE = re.compile(r"(/[A-Za-z0-9._/-]{1,255}):(/[A-Za-z0-9._/-]{1,255}):(r?w?m?)")
_GPU_ID = re.compile(r"(GPU|MIG)-[A-Za-z0-9/-]{1,80}|[0-9]{1,3}")
_MODES = ("rw", "ro")

# host_config keys this module turns into options; anything else is refused.
_HOST_KEYS = {
    "binds",
    "network_mode",
    "port_bindings",
    "shm_size",
    "cap_drop",
    "security_opt",
    "pids_limit",
    "mem_limit",
    "cpu_period",
    "cpu_quota",
    "devices",
    "device_requests",
}
_SPEC_KEYS = {
    "name",
    "hostname",
    "image",
    "command",
    "environment",
    "labels",
    "user",
    "working_dir",
    "volumes",
    "ports",
    "host_config",
}


@dataclass(frozen=True)
class DockerRun:
    """One ``docker run``: its options (no values of environment variables), the
    image and command, and the environment that reaches it through --env-file."""

    options: tuple[str, ...]
    image: str
    command: tuple[str, ...]
    env: dict[str, str]


def _match(pattern: re.Pattern, value, what: str) -> str:
    if not isinstance(value, str) or pattern.fullmatch(value) is None or ".." in value:
        raise ClusterError(f"{what} {value!r} cannot go into a batch script")
    return value


def _int(value, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ClusterError(f"{what} {value!r} is not a whole number")
    return str(value)


def env_lines(env: dict[str, str]) -> list[str]:
    """``KEY=VALUE`` lines for ``docker run --env-file`` (read literally: no quotes,
    no expansion); a value holding a line break or NUL cannot be written so."""
    lines = []
    for key, value in env.items():
        _match(_ENV_KEY, key, "Environment variable")
        if not isinstance(value, str) or any(c in value for c in "\n\r\0"):
            raise ClusterError(f"The value of {key} holds a line break; gpulab cannot pass it")
        lines.append(f"{key}={value}")
    return lines


def device_option(host_path: str, container_path: str) -> list[str]:
    """``--device host:container:rwm`` for one device node."""
    return ["--device", _match(_DEVICE, f"{host_path}:{container_path}:rwm", "Device")]


def gpus_option(request: dict) -> list[str]:
    """``--gpus`` for one NVIDIA device request of the spec (the CLI parses it as CSV
    and adds the "gpu" capability itself)."""
    if set(request) != {"driver", "device_ids", "capabilities"} or request["driver"] != "nvidia":
        raise ClusterError(f"GPU request {request!r} cannot go into a batch script")
    ids = [_match(_GPU_ID, i, "GPU id") for i in request["device_ids"]]
    (caps,) = request["capabilities"]
    caps = [_match(_WORD, c, "GPU capability") for c in caps if c != "gpu"]
    fields = ['"driver=nvidia"', '"device={}"'.format(",".join(ids))]
    if caps:
        fields.append('"capabilities={}"'.format(",".join(caps)))
    return ["--gpus", ",".join(fields)]


def bind_mount(source: str, target: str, readonly: bool) -> list[str]:
    """``--mount`` of a host folder, not ``-v``: a folder missing on the node (the
    projects' storage not mounted there) is then an error, not a new empty folder
    whose work would be lost with the node."""
    _match(_HOST_PATH, source, "Host folder")
    _match(_CONTAINER_PATH, target, "Mount point")
    return ["--mount", f"type=bind,source={source},target={target}" + (",readonly" * readonly)]


def _binds(binds: dict, volumes: list) -> list[str]:
    out = []
    for source, target in binds.items():
        mode = target["mode"]
        if mode not in _MODES or set(target) != {"bind", "mode"}:
            raise ClusterError(f"Mount {target!r} cannot go into a batch script")
        if source.startswith("/"):
            out += bind_mount(source, target["bind"], readonly=mode == "ro")
        else:
            volume = _match(_VOLUME, source, "Docker volume")
            bind = _match(_CONTAINER_PATH, target["bind"], "Mount point")
            out += ["-v", f"{volume}:{bind}:{mode}"]
    if sorted(t["bind"] for t in binds.values()) != sorted(volumes):
        raise ClusterError("The spec's volumes and binds disagree")
    return out


def _host_options(hc: dict, volumes: list) -> list[str]:
    unknown = set(hc) - _HOST_KEYS
    if unknown:
        raise ClusterError(f"The container spec sets {sorted(unknown)}, unknown here")
    if hc.get("port_bindings"):
        raise ClusterError("A project container publishes no port on the node")
    opts = ["--network", _match(_WORD, hc["network_mode"], "Network")]
    opts += _binds(hc["binds"], volumes)
    opts += ["--shm-size", _match(_SIZE, hc["shm_size"], "shm size")]
    for cap in hc["cap_drop"]:
        opts += ["--cap-drop", _match(_WORD, cap, "Capability")]
    for opt in hc["security_opt"]:
        opts += ["--security-opt", _match(_WORD, opt, "Security option")]
    if "pids_limit" in hc:
        opts += ["--pids-limit", _int(hc["pids_limit"], "pids limit")]
    if "mem_limit" in hc:
        opts += ["--memory", _int(hc["mem_limit"], "Memory limit")]
    if "cpu_quota" in hc:
        opts += ["--cpu-period", _int(hc["cpu_period"], "CPU period")]
        opts += ["--cpu-quota", _int(hc["cpu_quota"], "CPU quota")]
    for dev in hc.get("devices", []):
        host_path, container_path, _ = dev.split(":")
        opts += device_option(host_path, container_path)
    for request in hc.get("device_requests", []):
        opts += gpus_option(request)
    return opts


def run_args(spec: dict) -> DockerRun:
    """``docker run`` for a whole container spec (objects.container_spec)."""
    unknown = set(spec) - _SPEC_KEYS
    if unknown or "host_config" not in spec:
        raise ClusterError(f"The container spec sets {sorted(unknown)}, unknown here")
    opts = ["--name", _match(_CONTAINER_NAME, spec["name"], "Container name")]
    for key, value in sorted(spec["labels"].items()):
        _match(_LABEL_KEY, key, "Label")
        if not isinstance(value, str) or any(c in value for c in "\n\r\0"):
            raise ClusterError(f"Label {key} has a value a batch script cannot hold")
        opts += ["--label", f"{key}={value}"]
    if "hostname" in spec:
        opts += ["--hostname", _match(_HOSTNAME, spec["hostname"], "Hostname")]
    opts += ["--user", _match(_USER, spec["user"], "User")]
    opts += ["--workdir", _match(_CONTAINER_PATH, spec["working_dir"], "Working folder")]
    for port in spec["ports"]:
        opts += ["--expose", _match(_PORT, port, "Port")]
    opts += _host_options(spec["host_config"], spec["volumes"])
    command = tuple(spec["command"])
    if not all(isinstance(a, str) and "\0" not in a for a in command):
        raise ClusterError("The container command must be strings")
    env = dict(spec["environment"])
    env_lines(env)  # validated now, written by batch.py
    return DockerRun(
        options=tuple(opts),
        image=_match(_IMAGE, spec["image"], "Image"),
        command=command,
        env=env,
    )
