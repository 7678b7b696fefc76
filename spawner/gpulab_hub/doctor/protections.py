"""Which of gpulab's protections between tenants and the host are active here.

Pure functions of what Docker reports (``docker info``, the projects network,
the running project containers), so each is tested with recorded answers; the
threat model they belong to is docs/security.md.
"""

from __future__ import annotations

import docker.errors

from gpulab_hub import host
from gpulab_hub.cluster import hubjobs
from gpulab_hub.doctor.findings import FAIL, OK, WARN, Finding
from gpulab_hub.projects import objects

ENABLE_USERNS = (
    'Start dockerd with user-namespace remapping: add "userns-remap": "default" to '
    "/etc/docker/daemon.json and restart Docker (a dockerd that `gpulab up` starts has it). "
    "Images are then stored apart: run `gpulab up` again to rebuild the base image."
)


def check_userns(info: dict) -> Finding:
    """security.userns: root in a container is not root on the host."""
    fid = "security.userns"
    try:
        uid, gid = objects.userns_offset(info)
    except ValueError as e:
        return Finding(fid, WARN, str(e), ENABLE_USERNS)
    if uid:
        return Finding(
            fid,
            OK,
            f"user-namespace remapping is on: container uid 0 is host uid {uid}, the "
            f"notebook user (1000) is host uid {uid + 1000}, not a real account",
        )
    return Finding(
        fid,
        WARN,
        "user-namespace remapping is off: a process that became root inside a "
        "container would be root on the host (gpulab's other protections still apply), "
        "and the notebook user's files on the host belong to uid 1000",
        ENABLE_USERNS,
    )


def check_kernel_limits(info: dict) -> Finding:
    """security.limits: the engine can enforce process, memory and CPU limits."""
    fid = "security.limits"
    wanted = {"PidsLimit": "process", "MemoryLimit": "memory", "CpuCfsQuota": "CPU"}
    missing = [what for key, what in wanted.items() if info.get(key) is False]
    if missing:
        return Finding(
            fid,
            WARN,
            f"this kernel or cgroup set-up cannot enforce {', '.join(missing)} limits: "
            "one project could starve the others",
            "Enable the cgroup controllers (pids, memory, cpu) in the kernel command line "
            "or the cgroup v2 subtree, then restart Docker.",
        )
    return Finding(fid, OK, "process, memory and CPU limits can be enforced (cgroups)")


def check_builds(info: dict) -> Finding:
    """security.builds: image builds run confined (gpulab's engine runtime, images/confine.py)."""
    fid = "security.builds"
    if host.build_confined(info):
        return Finding(
            fid,
            OK,
            "image builds are confined: the engine creates containers through gpulab's "
            "runtime (build steps: no raw sockets, no privilege gain, a process limit), each "
            "build on a network of its own",
        )
    return Finding(
        fid,
        FAIL,
        f"this engine's default runtime is {info.get('DefaultRuntime')!r}, not gpulab's: "
        "build steps would run as root with raw sockets, so projects will not build",
        "Let `gpulab up` start the Docker engine, or add gpulab's runtime to it: in "
        '/etc/docker/daemon.json, "runtimes": {"gpulab": {"path": "<gpulab\'s '
        'venv>/bin/gpulab-build-runtime"}} and "default-runtime": "gpulab", then restart '
        "Docker (docs/security.md, \"Builds are confined like projects\").",
    )


def check_network(network: dict | None, name: str) -> Finding:
    """security.network: projects share no network namespace and cannot reach each other."""
    fid = "security.network"
    if network is None:
        return Finding(
            fid,
            WARN,
            f"gpulab's project network {name!r} does not exist yet",
            "`gpulab up` makes it (a bridge with inter-container traffic off).",
        )
    if network.get("Driver") != "bridge":
        return Finding(
            fid,
            FAIL,
            f"the project network {name!r} is a {network.get('Driver')!r} network, not a bridge",
            f"Remove it (`docker network rm {name}`) and run `gpulab up` to make it again.",
        )
    icc = (network.get("Options") or {}).get("com.docker.network.bridge.enable_icc", "true")
    if icc != "false":
        return Finding(
            fid,
            WARN,
            f"projects on the network {name!r} can reach each other's ports "
            "(inter-container traffic is on)",
            f"Stop the projects, `docker network rm {name}`, and run `gpulab up` to make it "
            "again with inter-container traffic off.",
        )
    return Finding(
        fid,
        OK,
        f"projects and builds run on the bridge {name!r} (not the host's network), "
        "with inter-container traffic off",
    )


def container_gaps(host_config: dict) -> list[str]:
    """What a project container lacks of gpulab's hardening (empty: all present)."""
    gaps = []
    if host_config.get("NetworkMode") in objects.REFUSED_NETWORKS:
        gaps.append(f"network {host_config.get('NetworkMode')}")
    if "ALL" not in (host_config.get("CapDrop") or []):
        gaps.append("capabilities kept")
    if not any("no-new-privileges" in o for o in host_config.get("SecurityOpt") or []):
        gaps.append("privilege gain allowed")
    if host_config.get("Privileged"):
        gaps.append("privileged")
    return gaps


def check_containers(inspected: list[dict]) -> Finding:
    """security.containers: every running project container carries the hardening."""
    fid = "security.containers"
    bad = []
    for c in inspected:
        gaps = container_gaps(c.get("HostConfig") or {})
        if not (c.get("Config") or {}).get("User"):
            gaps.append("runs as the image's user")
        if gaps:
            bad.append(f"{c.get('Name', '?').lstrip('/')} ({', '.join(gaps)})")
    if bad:
        return Finding(
            fid,
            FAIL,
            "project containers started without gpulab's protections: " + "; ".join(bad),
            "Restart those projects (they were started by an older gpulab): each new start "
            "applies the protections.",
        )
    return Finding(
        fid,
        OK,
        f"{len(inspected)} running project container(s), each on the bridge network as the "
        "notebook user, with no capabilities and no privilege gain",
    )


def findings(dk, info: dict, network_name: str, probes) -> list[Finding]:
    """Every protection finding; ``dk`` is the doctor's Docker client, ``probes`` the
    hub's sandbox.ProbeInputs. Project containers are those of exactly the names the
    hub gives them (a label is not enough: an image can carry any label)."""
    try:
        network = dk.call("inspect_network", network_name)
    except docker.errors.NotFound:
        network = None
    running = [
        c
        for c in dk.call("containers", filters={"name": f"{probes.prefix}-"})
        if any(
            hubjobs.parse_name(n.lstrip("/"), probes.prefix, probes.escape)
            for n in c.get("Names") or []
        )
    ]
    inspected = [dk.call("inspect_container", c["Id"]) for c in running]
    return [
        check_userns(info),
        check_kernel_limits(info),
        check_builds(info),
        check_network(network, network_name),
        check_containers(inspected),
    ]
