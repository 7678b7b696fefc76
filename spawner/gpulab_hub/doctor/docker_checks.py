"""The Docker engine, how it can give containers GPUs, and throwaway probe containers.

Every Docker call goes through :meth:`gpulab_hub.host.Docker.call`.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from pathlib import Path

import docker
import docker.errors
import docker.utils
import requests.exceptions

from gpulab_hub import host
from gpulab_hub.doctor import probe
from gpulab_hub.doctor.findings import FAIL, OK, WARN, Finding, gpu_absent
from gpulab_hub.doctor.gpu import Inventory
from gpulab_hub.projects import objects

DOCKER_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)
CALL_TIMEOUT = 30  # seconds for one Docker API call (doctor must finish within a minute)
MARKER = "@@gpulab-doctor@@"
# What the explicit-devices path mounts from the driver folder (GPULAB_DRIVER_DIR).
DRIVER_LIBS = ("libcuda.so.1", "libnvidia-ml.so.1")


def doctor_docker() -> host.Docker:
    """gpulab's Docker client with short timeouts: a hung engine must not hang the doctor."""
    return host.Docker(timeout=CALL_TIMEOUT)


def check_engine(dk: host.Docker) -> tuple[Finding, dict | None]:
    """docker.engine: the engine answers; returns its ``docker info`` too."""
    try:
        info = dk.call("info")
    except DOCKER_ERRORS as e:
        first = str(e).splitlines()[0][:200]
        return (
            Finding(
                "docker.engine",
                FAIL,
                f"the Docker engine does not answer ({first})",
                "Start it: `gpulab up` starts dockerd, or `systemctl start docker`; check "
                "DOCKER_HOST and that this user may use the Docker socket.",
            ),
            None,
        )
    seen = (
        f"Docker {info.get('ServerVersion', '?')} answers; storage {info.get('Driver', '?')}, "
        f"data root {info.get('DockerRootDir', '?')}"
    )
    return Finding("docker.engine", OK, seen), info


def device_nodes(dev_root: str = "/dev") -> list[str]:
    """The GPU device nodes (/dev/nvidia0, /dev/nvidia1, ...), sorted by number."""
    nodes = [p for p in Path(dev_root).glob("nvidia[0-9]*") if p.name[6:].isdigit()]
    return [str(p) for p in sorted(nodes, key=lambda p: int(p.name[6:]))]


def driver_dir(environ) -> str:
    """The host folder the explicit-devices path mounts (its lib64/ holds the driver)."""
    return environ.get("GPULAB_DRIVER_DIR") or objects.GpuAssignment().driver_dir


def all_gpus(inv: Inventory, info: dict, drivers: str, dev_root: str = "/dev"):
    """Every GPU, given the way gpulab gives a project its GPUs on this host (or None)."""
    isolation = objects.detect_isolation(info, dev_root)
    if isolation == objects.NO_GPU or not inv.gpus:
        return None
    minors = tuple(int(Path(n).name[6:]) for n in device_nodes(dev_root))
    uuids = tuple(g.uuid for g in inv.gpus)
    return objects.GpuAssignment(uuids, minors, isolation, drivers)


def gpu_container_args(g: objects.GpuAssignment) -> tuple[dict, dict]:
    """(host_config, environment) as gpulab's container spec gives them (objects.py)."""
    host_config = objects.gpu_host_config(g)
    if g.isolation == objects.DEVICES:
        host_config["binds"] = {g.driver_dir: {"bind": g.driver_dir, "mode": "ro"}}
    return host_config, objects.gpu_env(g)


def check_gpu_access(
    info: dict, inv: Inventory, drivers: str, cpu_only: bool, dev_root: str = "/dev"
) -> Finding:
    """docker.gpu_access: gpulab has a way to give a container GPUs on this host."""
    fid = "docker.gpu_access"
    if not inv.present:
        return gpu_absent(
            fid,
            "skipped: no NVIDIA driver, so there is no GPU to give containers",
            "Install the NVIDIA driver first (see host.driver).",
            cpu_only,
        )
    isolation = objects.detect_isolation(info, dev_root)
    if isolation == objects.RUNTIME:
        return Finding(
            fid,
            OK,
            "Docker has the NVIDIA container runtime (or a CDI spec): gpulab "
            "passes each project its GPUs by UUID (device_requests)",
        )
    toolkit = (
        "install the NVIDIA container toolkit and run "
        "`nvidia-ctk runtime configure --runtime=docker`"
    )
    if isolation == objects.NO_GPU:
        return Finding(
            fid,
            FAIL,
            "the driver answers but containers cannot get a GPU: no NVIDIA "
            f"runtime, no CDI spec and no {dev_root}/nvidiactl",
            f"Create the device nodes (`nvidia-modprobe -u -c=0`) or {toolkit}.",
        )
    lib64 = Path(drivers) / "lib64"
    missing = [lib for lib in DRIVER_LIBS if not (lib64 / lib).exists()]
    nodes = device_nodes(dev_root)
    seen = (
        f"no NVIDIA runtime: gpulab passes the device nodes ({', '.join(nodes) or 'none'} "
        f"and the control nodes) and mounts the driver folder {drivers} read-only; "
        "`docker run --gpus` would fail here with 'could not select device driver'"
    )
    if missing or not nodes:
        what = f"{lib64} lacks {', '.join(missing)}" if missing else f"no {dev_root}/nvidia<N>"
        return Finding(
            fid,
            FAIL,
            f"{seen}, but {what}",
            "Set GPULAB_DRIVER_DIR to a folder whose lib64/ holds the driver's "
            f"libraries (libcuda.so.1, libnvidia-ml.so.1), or {toolkit}.",
        )
    return Finding(fid, OK, seen)


def parse_probe_output(text: str) -> dict | None:
    for line in reversed(text.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER) :])
    return None


def run_probe(
    dk: host.Docker,
    image: str,
    args: list[str],
    prefix: str,
    host_config: dict | None = None,
    environment: dict | None = None,
    timeout: float = 40,
) -> dict:
    """Run probe.py in a throwaway container of ``image``; its facts, or {"error": ...}."""
    name = f"{prefix}-doctor-{uuid.uuid4().hex[:8]}"
    hc = dk.call("create_host_config", network_mode="none", **(host_config or {}))
    source = Path(probe.__file__).read_text()
    try:
        cid = dk.call(
            "create_container",
            image,
            command=["python3", "-c", source, *args],
            host_config=hc,
            name=name,
            labels={"gpulab.doctor": prefix},
            environment=environment or {},
        )["Id"]
    except DOCKER_ERRORS as e:
        return {"error": f"cannot create a container of {image}: {_short(e)}"}
    try:
        dk.call("start", cid)
        status = dk.call("wait", cid, timeout=timeout).get("StatusCode")
        logs = dk.call("logs", cid, stdout=True, stderr=True).decode(errors="replace")
    except DOCKER_ERRORS as e:
        return {"error": _short(e)}
    finally:
        # An engine that stopped answering leaves it; its name carries the prefix.
        with contextlib.suppress(*DOCKER_ERRORS):
            dk.call("remove_container", cid, force=True)
    facts = parse_probe_output(logs)
    if facts is None:
        tail = " | ".join(logs.strip().splitlines()[-3:])
        return {"error": f"the probe exited with {status}: {tail or 'no output'}"}
    return facts


def _short(e: Exception) -> str:
    text = getattr(e, "explanation", None) or str(e)
    return str(text).splitlines()[0][:300]


def check_gpu_container(
    dk: host.Docker,
    image: str | None,
    inv: Inventory,
    info: dict,
    drivers: str,
    prefix: str,
    cpu_only: bool,
) -> Finding:
    """docker.gpu_container: a test container given every GPU, the way gpulab gives a
    project its GPUs, sees them through NVML."""
    fid = "docker.gpu_container"
    if not inv.present or not inv.gpus:
        return gpu_absent(
            fid,
            "skipped: no GPU on this host, so no test container can see one",
            "Nothing to test until a GPU and its driver are present (host.driver).",
            cpu_only,
        )
    if not image:
        return Finding(
            fid,
            WARN,
            "not tested: no image with python3 to run the test container in",
            "Build the base image (`gpulab up`) or name one: `gpulab doctor --image IMAGE`.",
        )
    g = all_gpus(inv, info, drivers)
    if g is None:
        return Finding(
            fid,
            FAIL,
            "not tested: Docker has no way to give a container a GPU here",
            "See docker.gpu_access.",
        )
    host_config, env = gpu_container_args(g)
    facts = run_probe(dk, image, ["nvml", "libnvidia-ml.so.1"], prefix, host_config, env)
    how = f"a container of {image} given {len(inv.gpus)} GPU(s) ({g.isolation})"
    if "error" in facts and not facts.get("gpus"):
        return Finding(
            fid,
            FAIL,
            f"{how} sees no GPU: {facts['error']}",
            "Check that containers may open the device nodes (cgroup device rules, "
            "rootless Docker) and that the driver's libraries are where "
            "docker.gpu_access says.",
        )
    seen_gpus = [f"{g['name']} (cc {g['cc'][0]}.{g['cc'][1]})" for g in facts["gpus"]]
    seen = f"{how} sees {len(seen_gpus)} through NVML: {', '.join(seen_gpus)}"
    if len(seen_gpus) != len(inv.gpus):
        return Finding(
            fid,
            FAIL,
            seen + f", the host has {len(inv.gpus)}",
            "Compare `nvidia-smi -L` on the host with what the container is given.",
        )
    return Finding(fid, OK, seen)
