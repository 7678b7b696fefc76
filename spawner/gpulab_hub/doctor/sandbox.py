"""Probe containers: an image run the way gpulab runs a project's container.

Every image the doctor runs may be a user's (a project's own image, an image a
project's Dockerfile starts FROM, even the GPU test image), so its container is
the project container's spec, ``objects.container_spec`` (no capabilities,
``no-new-privileges``, the notebook user, the process, memory and CPU limits,
gpulab's bridge network, never the host's), less the project's folders and port,
which the probe needs not. Probing a running project ``docker exec``\\ s into the
container the hub started, as the notebook user, inside that container's own
confinement. Output is read bounded in size and time, and judged by answer.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

import docker.errors
import requests.exceptions

from gpulab_hub import host
from gpulab_hub.cluster import hubjobs
from gpulab_hub.doctor import answer, probe
from gpulab_hub.doctor.answer import ProbeError
from gpulab_hub.projects import objects

DOCKER_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)

PROBE_TIMEOUT = 40.0  # seconds a probe may take, start to last byte
POLL = 0.2  # seconds between looks at a probe container that still runs
# The engine keeps at most this much of a probe container's output (an endless
# writer fills no disk); the doctor reads at most answer.MAX_OUTPUT of it.
LOG_CONFIG = {"type": "json-file", "config": {"max-size": "2m", "max-file": "1"}}
_NOWHERE = "/nonexistent"  # the project's folders, which a probe container is not given
_PORT = 8888  # in the spec only; a probe container publishes and exposes nothing


@dataclasses.dataclass(frozen=True)
class ProbeInputs:
    """The hub's settings a probe container shares with a project's container, and
    the names the hub gives project containers (all from the spawner's traits)."""

    prefix: str
    network: str
    user: str  # uid:gid of the notebook user
    shm_size: str
    mem_limit: int | None
    cpu_limit: float | None
    pids_limit: int | None
    escape: Callable[[str], str]


def of_spawner(sp) -> ProbeInputs:
    """The probe settings of the hub's spawner (hubsettings.spawner_of)."""
    return ProbeInputs(
        prefix=sp.prefix,
        network=sp.network_name,
        user=f"{sp.notebook_uid}:{sp.notebook_gid}",
        shm_size=sp.shm_size,
        mem_limit=sp.mem_limit,
        cpu_limit=sp.cpu_limit,
        pids_limit=sp.pids_limit,
        escape=sp.escape,
    )


def container_name(s: ProbeInputs, owner: str, project: str) -> str:
    """The exact name the spawner gives the project's container."""
    return hubjobs.container_name(s.prefix, s.escape, owner, project)


def probe_spec(
    s: ProbeInputs, image: str, command: list[str], gpus: objects.GpuAssignment | None = None
) -> dict:
    """``create_container`` arguments of a probe container: a project container's spec
    for ``image`` (``gpus`` given the way gpulab gives a project its GPUs), without the
    project's folders, its data, its cache volume or its port."""
    settings = objects.ContainerInputs(
        name=f"{s.prefix}-doctor-{uuid.uuid4().hex[:8]}",
        image=image,
        command=command,
        env={},
        project_dir=_NOWHERE,
        data_root=_NOWHERE,
        hf_cache_volume=_NOWHERE,
        network=s.network,
        port=_PORT,
        owner="doctor",
        labels={"gpulab.doctor": s.prefix},
        user=s.user,
        shm_size=s.shm_size,
        mem_limit=s.mem_limit,
        cpu_limit=s.cpu_limit,
        pids_limit=s.pids_limit,
        gpus=gpus or objects.GpuAssignment(),
    )
    spec = objects.container_spec(settings)
    spec.pop("hostname", None)  # a probe is no project: Docker names its host
    folders = objects.volume_binds(dataclasses.replace(settings, gpus=objects.GpuAssignment()))
    hc = spec["host_config"]
    hc["binds"] = {k: v for k, v in hc["binds"].items() if k not in folders}
    hc["log_config"] = LOG_CONFIG
    spec["volumes"] = sorted(b["bind"] for b in hc["binds"].values())
    del spec["ports"]
    return spec


def short(e: Exception) -> str:
    """A Docker error in one line."""
    text = getattr(e, "explanation", None) or str(e)
    return str(text).splitlines()[0][:300] if str(text).strip() else type(e).__name__


def read_bounded(chunks: Iterable[bytes], deadline: float) -> tuple[bytes, bool]:
    """At most answer.MAX_OUTPUT bytes of ``chunks``, and whether there was more."""
    data = bytearray()
    try:
        for chunk in chunks:
            data += chunk
            if len(data) > answer.MAX_OUTPUT:
                return bytes(data[: answer.MAX_OUTPUT]), True
            if time.monotonic() > deadline:
                raise ProbeError(f"the probe did not finish answering within {PROBE_TIMEOUT:.0f} s")
    finally:
        with contextlib.suppress(AttributeError):
            chunks.close()  # type: ignore[attr-defined]
    return bytes(data), False


def _command(args: list[str]) -> list[str]:
    return ["python3", "-c", Path(probe.__file__).read_text(), *args]


def run_probe(
    dk: host.Docker,
    image: str,
    args: list[str],
    s: ProbeInputs,
    gpus: objects.GpuAssignment | None = None,
    timeout: float = PROBE_TIMEOUT,
) -> dict:
    """probe.py's answer (mode ``args[0]``) from a throwaway probe container of ``image``.

    Raises ProbeError when it gives none, answer.Unreadable when its answer cannot be read.
    """
    deadline = time.monotonic() + timeout
    spec = probe_spec(s, image, _command(args), gpus)
    try:
        spec["host_config"] = dk.call("create_host_config", **spec["host_config"])
        cid = dk.call("create_container", **spec)["Id"]
    except DOCKER_ERRORS as e:
        raise ProbeError(f"cannot create a container of {image}: {short(e)}") from None
    try:
        dk.call("start", cid)
        while dk.call("inspect_container", cid)["State"].get("Running"):
            if time.monotonic() > deadline:
                raise ProbeError(f"the probe did not finish within {timeout:.0f} s")
            time.sleep(POLL)
        logs = dk.call("logs", cid, stdout=True, stderr=True, stream=True, follow=False)
        output, cut = read_bounded(logs, deadline)
    except DOCKER_ERRORS as e:
        raise ProbeError(short(e)) from None
    finally:
        # An engine that stopped answering leaves it; its name carries the prefix.
        with contextlib.suppress(*DOCKER_ERRORS):
            dk.call("remove_container", cid, force=True)
    return answer.read(output, cut, args[0])


def exec_probe(
    dk: host.Docker, container_id: str, s: ProbeInputs, timeout: float = PROBE_TIMEOUT
) -> dict:
    """probe.py's answer (mode ``project``) from inside a running project container,
    run as the notebook user. Raises as run_probe does."""
    deadline = time.monotonic() + timeout
    try:
        eid = dk.call("exec_create", container_id, _command(["project"]), user=s.user)["Id"]
        output, cut = read_bounded(dk.call("exec_start", eid, stream=True), deadline)
    except DOCKER_ERRORS as e:
        raise ProbeError(short(e)) from None
    return answer.read(output, cut, "project")
