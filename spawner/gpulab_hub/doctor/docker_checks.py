"""The Docker engine, how it can give containers GPUs, and a GPU test container.

Every Docker call goes through :meth:`gpulab_hub.host.Docker.call`.
"""

from __future__ import annotations

from pathlib import Path

from gpulab_hub import host
from gpulab_hub.doctor import sandbox
from gpulab_hub.doctor.answer import ProbeError
from gpulab_hub.doctor.findings import FAIL, OK, WARN, Finding, gpu_absent
from gpulab_hub.doctor.gpu import Inventory
from gpulab_hub.gpus import nvml, wsl
from gpulab_hub.projects import objects

DOCKER_ERRORS = sandbox.DOCKER_ERRORS
_short = sandbox.short  # a Docker error in one line (cluster.py's name for it)
CALL_TIMEOUT = 30  # seconds for one Docker API call (doctor must finish within a minute)
# What the explicit-devices path mounts from the driver folder (ProjectSpawner.driver_dir).
DRIVER_LIBS = ("libcuda.so.1", nvml.SONAME)


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


def _wsl_host(dev_root: str) -> wsl.GpuHost:
    """WSL2 or not, judged from the root above ``dev_root`` (gpus/wsl.py)."""
    return wsl.detect(str(Path(dev_root).parent))


def all_gpus(inv: Inventory, info: dict, drivers: str, dev_root: str = "/dev"):
    """Every GPU, given the way gpulab gives a project its GPUs on this host (or None)."""
    if _wsl_host(dev_root).shared:  # /dev/dxg: every GPU, shared (as gpus/spawner.py does)
        uuids = tuple(g.uuid for g in inv.gpus)
        return objects.GpuAssignment(uuids, (), objects.WSL2, wsl.WSL_DIR)
    isolation = objects.detect_isolation(info, dev_root)
    if isolation == objects.NO_GPU or not inv.gpus:
        return None
    minors = tuple(int(Path(n).name[6:]) for n in device_nodes(dev_root))
    uuids = tuple(g.uuid for g in inv.gpus)
    return objects.GpuAssignment(uuids, minors, isolation, drivers)


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
    wsl_host = _wsl_host(dev_root)
    if wsl_host.shared:
        seen = (
            f"WSL2: gpulab gives each GPU project {wsl.DXG} and {wsl.WSL_DIR} (read-only), "
            "every GPU shared by all GPU projects (see host.gpu_sharing)"
        )
        if not wsl_host.lib_dir:
            return Finding(
                fid,
                FAIL,
                f"{seen}, but {wsl.WSL_LIB} is missing",
                "Install the NVIDIA driver for Windows (not inside WSL); it provides "
                f"{wsl.WSL_LIB}.",
            )
        return Finding(fid, OK, seen)
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


def check_gpu_container(
    dk: host.Docker,
    image: str | None,
    inv: Inventory,
    info: dict,
    drivers: str,
    probes: sandbox.ProbeInputs,
    cpu_only: bool,
) -> Finding:
    """docker.gpu_container: a test container given every GPU, the way gpulab gives a
    project its GPUs (and confined as a project's container), sees them through NVML."""
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
    how = f"a container of {image} given {len(inv.gpus)} GPU(s) ({g.isolation})"
    try:
        # NVML as a project's process would open it, from inside the container: the
        # probe's own few ctypes calls (probe.py says why not the binding)
        facts = sandbox.run_probe(dk, image, ["nvml", nvml.SONAME], probes, g)
    except ProbeError as e:
        facts = {"gpus": [], "error": str(e)}
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
