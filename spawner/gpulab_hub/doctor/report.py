"""Run every check, in an order where later ones reuse what earlier ones found,
and keep the last report at ``<GPULAB_HOME>/hub/doctor-last.json``."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gpulab_hub import host, hubsettings, images, jsonfile
from gpulab_hub.cluster import hubjobs
from gpulab_hub.doctor import (
    answer,
    cluster,
    cuda,
    docker_checks,
    egress,
    gpu,
    project,
    protections,
    resources,
    sandbox,
)
from gpulab_hub.doctor.findings import FAIL, OK, WARN, Finding, exit_code
from gpulab_hub.gpus import wsl as wsl_gpus
from gpulab_hub.hubsettings import Layout
from gpulab_hub.images import project as projectimage
from gpulab_hub.projects import Project, ProjectError

MAX_IMAGES = 6  # images looked into per run (each is one short container)
IMAGE_CACHE_NAME = "doctor-images.json"
MAX_CACHE_BYTES = 8 << 20  # the image facts cache is read at most this far


@dataclass
class Options:
    project: str | None = None  # USER/PROJECT
    cpu_only: bool = False  # this host is meant to have no GPU
    image: str | None = None  # image for the GPU test container (default: the base image)
    probe_jobs: bool = True  # on a Slurm cluster: a short probe job on each idle node


def report_path(hub: Layout) -> Path:
    return hub.doctor_report


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def images_in_use(dk: host.Docker, hub: Layout, probes: sandbox.ProbeInputs) -> list[str]:
    """The base image, what project Dockerfiles start FROM, images of running projects
    (containers of exactly the names the hub gives them: never a label, which an image
    can carry)."""
    projects_root = hub.projects_root
    refs = [hub.base_image]
    for dockerfile in sorted(projects_root.glob("*/*/Dockerfile")):
        where = Project(projects_root, dockerfile.parent.parent.name, dockerfile.parent.name)
        try:  # hostile input: no link, no FIFO, bounded (safefs.py)
            refs.append(images.base_of(projectimage.read_dockerfile(where)))
        except (OSError, ValueError, ProjectError):
            continue
    for c in dk.call("containers", filters={"name": f"{probes.prefix}-"}):
        names = [n.lstrip("/") for n in c.get("Names") or []]
        if any(_a_projects(n, probes) for n in names):
            refs.append(c["Image"])
    return [r for r in dict.fromkeys(refs) if r]


def _a_projects(name: str, probes: sandbox.ProbeInputs) -> bool:
    """Whether ``name`` is the name the hub gives a project's container."""
    parsed = hubjobs.parse_name(name, probes.prefix, probes.escape)
    return parsed is not None and not parsed[2]


def image_facts(
    dk: host.Docker, ref: str, probes: sandbox.ProbeInputs, cache: dict
) -> dict | None:
    """Env and torch facts of a local image (cached by image ID: an ID never changes),
    probed in a container confined as a project's (sandbox.py)."""
    try:
        inspected = dk.call("inspect_image", ref)
    except docker_checks.DOCKER_ERRORS:
        return None
    image_id = inspected["Id"]
    env = dict(e.split("=", 1) for e in inspected["Config"].get("Env") or [] if "=" in e)
    if image_id not in cache:
        try:
            cache[image_id] = sandbox.run_probe(dk, image_id, ["image"], probes)
        except answer.ProbeError as e:
            return {"id": image_id, "env": env, "error": str(e)}
    return {"id": image_id, "env": env, **cache[image_id]}


def read_cache(path: Path) -> dict:
    """The doctor's image facts by image ID (its own file; each entry checked again)."""
    try:
        with path.open("rb") as f:
            data = json.loads(f.read(MAX_CACHE_BYTES + 1))
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    good = {}
    for image_id, facts in data.items():
        with contextlib.suppress(answer.Unreadable):
            good[image_id] = answer.check(facts, "image")
    return good


def image_findings(ref: str, facts: dict, inv: gpu.Inventory, cpu_only: bool) -> list[Finding]:
    out = []
    if "error" in facts:
        out.append(
            Finding(
                f"image.{ref}.probe",
                WARN,
                f"cannot look inside {ref}: {facts['error']}",
                "Give the image a python3 on its PATH (gpulab's base image has one) that "
                "answers within 40 s, so torch and its CUDA can be checked; if Docker "
                "refused the container, see security.network (`gpulab up` makes the network).",
            )
        )
    t = facts.get("torch", {})
    torch_cuda = gpu.version_tuple(t.get("cuda", ""))[:2] or None
    image_cuda = cuda.image_cuda_version(facts["env"])
    out.append(cuda.check_image_cuda(ref, image_cuda, torch_cuda, inv, cpu_only))
    if inv.gpus:
        version = t.get("version", "")
        out.append(
            cuda.check_torch_arch(f"image.{ref}.torch_arch", version, t.get("arch_flags"), inv.gpus)
        )
        out.append(
            cuda.check_build_arch_list(
                f"image.{ref}.build_arch_list",
                facts["env"].get("TORCH_CUDA_ARCH_LIST"),
                version,
                inv.gpus,
            )
        )
    return out


def docker_findings(
    dk, info, hub: Layout, probes: sandbox.ProbeInputs, environ, opts, inv
) -> list[Finding]:
    drivers = hub.driver_dir  # the spawner's driver_dir, as projects get it
    out = [docker_checks.check_gpu_access(info, inv, drivers, opts.cpu_only)]
    prefix = hub.prefix
    refs = images_in_use(dk, hub, probes)
    cache_file = hub.records_dir / IMAGE_CACHE_NAME
    cache = read_cache(cache_file)
    checked = refs[:MAX_IMAGES]
    with ThreadPoolExecutor(3) as pool:
        facts = dict(
            zip(
                checked, pool.map(lambda r: image_facts(dk, r, probes, cache), checked), strict=True
            )
        )
    present = [r for r in checked if facts[r] is not None]
    test_image = opts.image or next((r for r in present if "error" not in facts[r]), None)
    out.append(
        docker_checks.check_gpu_container(dk, test_image, inv, info, drivers, probes, opts.cpu_only)
    )
    base = hub.base_image
    if facts.get(base) is None:
        out.append(
            Finding(
                f"image.{base}.present",
                WARN,
                f"the base image {base} is not built",
                "Run `gpulab up`: it builds the base image new projects start FROM.",
            )
        )
    more = f" (the first {MAX_IMAGES} of {len(refs)})" if len(refs) > MAX_IMAGES else ""
    out.append(
        Finding(
            "images.in_use", OK, f"images in use{more}: " + (", ".join(present) or "none built yet")
        )
    )
    for ref in present:
        out += image_findings(ref, facts[ref], inv, opts.cpu_only)
    with contextlib.suppress(OSError):  # a read-only hub folder: the cache only saves time
        cache_file.write_text(json.dumps(cache))
    volumes = [
        v["Name"]
        for v in dk.call("volumes").get("Volumes") or []
        if v["Name"].startswith(f"{prefix}-hf-")
    ]
    out.append(resources.check_docker_disk(info))
    out.append(
        resources.check_hf_cache(
            volumes, info.get("DockerRootDir", ""), "/cache/huggingface", environ
        )
    )
    return out


def run(environ, opts: Options) -> tuple[list[Finding], dict]:
    """Every finding, and the report (with when, where, the exit code) to save."""
    started = time.monotonic()
    spawner = hubsettings.spawner_of(hubsettings.read_config(hubsettings.config_file()))
    hub = hubsettings.from_spawner(spawner)
    probes = sandbox.of_spawner(spawner)
    on_cluster = cluster.settings_of(spawner)
    inv = gpu.inventory()
    proc_version = _read("/proc/version")
    wsl = resources.is_wsl2(proc_version, environ)
    meminfo = _read("/proc/meminfo")
    findings = [
        gpu.check_driver(inv, gpu.nvidia_pci_devices(), wsl, opts.cpu_only),
        resources.check_memory(meminfo, os.cpu_count() or 1),
    ]
    sharing = gpu.check_gpu_sharing(wsl_gpus.detect(wsl_gpus.HOST_ROOT))
    if sharing is not None:
        findings.append(sharing)
    if wsl:
        conf = resources.find_wslconfig(environ=environ)
        findings.append(
            resources.check_wsl2(
                meminfo,
                _read(str(conf)) if conf else None,
                str(conf or "%UserProfile%\\.wslconfig"),
            )
        )
    findings.append(
        resources.check_disk(
            "disk.gpulab_home",
            "gpulab's projects and data",
            str(hub.projects_root),
            resources.HOME_DISK,
        )
    )
    dk = docker_checks.doctor_docker()
    engine, info = docker_checks.check_engine(dk)
    findings.append(engine)
    if info is not None:
        try:
            findings += protections.findings(dk, info, hub.network, probes)
            findings += egress.findings(dk, hub.network, environ)
            findings += docker_findings(dk, info, hub, probes, environ, opts, inv)
            if opts.project:
                drivers = hub.driver_dir  # the spawner's driver_dir, as projects get it
                gpus = docker_checks.all_gpus(inv, info, drivers)
                findings += project.project_findings(dk, hub, probes, opts.project, gpus)
        except docker_checks.DOCKER_ERRORS as e:
            findings.append(
                Finding(
                    "docker.engine",
                    FAIL,
                    f"the Docker engine stopped answering mid-check: {sandbox.short(e)}",
                    "Check `docker info` and the engine's log, then run again.",
                )
            )
    if on_cluster is not None:
        findings += cluster.findings(
            on_cluster,
            hub.prefix,
            dk if info is not None else None,
            probe=opts.probe_jobs,
            folders=(hub.projects_root, hub.data_root),
        )
    report = {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "project": opts.project,
        "cpu_only": opts.cpu_only,
        "cluster": on_cluster.cluster_name if on_cluster is not None else None,
        "exit_code": exit_code(findings),
        "duration_s": round(time.monotonic() - started, 1),
        "findings": [f.to_dict() for f in findings],
    }
    return findings, report


def save(report: dict, path: Path) -> None:
    """Write atomically and durably, so the hub page never reads half a report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    jsonfile.write_atomic(path, report)


def load_last(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
