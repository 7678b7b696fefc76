"""Checks inside one project's container: CUDA copies, visible GPUs, torch, precision.

``gpulab doctor --project USER/PROJECT`` runs probe.py in the running container
(``docker exec``), or in a throwaway container of the project's image, both found
from the hub's own records only (sandbox.py runs it, answer.py reads its answer).
The checks are pure functions of the facts the probe reports.
"""

from __future__ import annotations

from dataclasses import dataclass

import docker.errors

from gpulab_hub import host, images
from gpulab_hub.doctor import answer, cuda, libs, sandbox
from gpulab_hub.doctor.answer import shown
from gpulab_hub.doctor.findings import FAIL, OK, WARN, Finding
from gpulab_hub.doctor.gpu import Gpu
from gpulab_hub.hubsettings import Layout
from gpulab_hub.images import project as projectimage
from gpulab_hub.projects import Project, ProjectError, objects, project_name, safe_owner

NO_GPU_CVD = ("", "-1", "none", "nodevfiles")


def normalize(facts: dict) -> dict:
    """Add the probe's ``ldconfig -p`` lines to its list of libraries."""
    extra = [
        {"path": path, "real": facts.get("realpaths", {}).get(path, path), "where": "ldconfig"}
        for _, path in libs.parse_ldconfig(facts.get("ldconfig", ""))
    ]
    return {**facts, "libs": list(facts.get("libs", [])) + extra}


def torch_gpus(facts: dict) -> list[Gpu]:
    devices = facts.get("torch", {}).get("devices") or []
    return [Gpu(i, d["name"], cc=tuple(d["cc"])) for i, d in enumerate(devices)]


def check_visible_devices(facts: dict) -> Finding:
    """project.visible_devices: CUDA_VISIBLE_DEVICES does not hide the allocated GPUs."""
    fid = "project.visible_devices"
    n = len(facts.get("device_nodes", []))
    cvd = facts.get("env", {}).get("CUDA_VISIBLE_DEVICES")
    if n == 0:
        return Finding(fid, OK, "no GPU is allocated to this project's container")
    if cvd is None:
        return Finding(fid, OK, f"CUDA_VISIBLE_DEVICES is unset: all {n} allocated GPU(s) visible")
    fix = (
        "Remove CUDA_VISIBLE_DEVICES from the Dockerfile / notebook: the container holds only "
        f"its own GPUs, numbered 0..{n - 1} inside it."
    )
    if cvd.strip().lower() in NO_GPU_CVD:
        return Finding(
            fid, FAIL, f"CUDA_VISIBLE_DEVICES={cvd!r} hides all {n} allocated GPU(s)", fix
        )
    items = [i.strip() for i in cvd.split(",") if i.strip()]
    if all(i.isdigit() for i in items):
        missing = [i for i in items if int(i) >= n]
        if missing:
            return Finding(
                fid,
                FAIL,
                f"CUDA_VISIBLE_DEVICES={cvd!r} names GPU {', '.join(missing)}"
                f", but the container has {n} (0..{n - 1}); CUDA stops at the first "
                "missing index, so later ones are hidden too",
                fix,
            )
        if len(set(items)) < n:
            return Finding(
                fid,
                WARN,
                f"CUDA_VISIBLE_DEVICES={cvd!r} shows {len(set(items))} of "
                f"the {n} allocated GPUs; the others sit idle",
                fix,
            )
    return Finding(fid, OK, f"CUDA_VISIBLE_DEVICES={cvd!r} with {n} allocated GPU(s)")


def check_torch(facts: dict) -> Finding:
    """project.torch: torch imports and, when GPUs are allocated, sees CUDA."""
    fid = "project.torch"
    t = facts.get("torch", {})
    n = len(facts.get("device_nodes", []))
    if t.get("error"):
        return Finding(
            fid,
            FAIL,
            f"`import torch` fails: {t['error']}",
            "Reinstall torch with its CUDA libraries (`pip install --force-reinstall "
            "torch`), and check project.cudart / project.cudnn.",
        )
    if not t.get("version"):
        return Finding(fid, OK, "torch is not installed in this project")
    build = f"torch {t['version']} (CUDA {t.get('cuda') or 'none: CPU build'})"
    if n == 0:
        return Finding(fid, OK, f"{build}; no GPU allocated, so it runs on the CPU")
    if not t.get("cuda"):
        return Finding(
            fid,
            WARN,
            f"{build} with {n} GPU(s) allocated: the GPUs go unused",
            "Install a CUDA build of torch (e.g. `pip install torch --index-url "
            "https://download.pytorch.org/whl/cu124`) with %gpu_install.",
        )
    if not t.get("available"):
        why = t.get("cuda_error") or "torch.cuda.is_available() is False"
        return Finding(
            fid,
            FAIL,
            f"{build} does not see CUDA with {n} GPU(s) allocated: {why}",
            "See project.visible_devices, and on the host host.driver and "
            "image.*.cuda (the driver must support torch's CUDA).",
        )
    names = ", ".join(d["name"] for d in t.get("devices", []))
    return Finding(fid, OK, f"{build} sees {t.get('device_count', 0)} GPU(s): {names}")


def check_precision(facts: dict) -> Finding | None:
    """project.precision: bf16 or fp16 for mixed precision on these GPUs (advice)."""
    gpus = torch_gpus(facts)
    if not gpus:
        return None
    names = ", ".join(sorted({g.name for g in gpus}))
    if all(g.cc and g.cc >= (8, 0) for g in gpus):
        return Finding(
            "project.precision",
            OK,
            f"{names} support bf16 natively",
            "Prefer torch.autocast(dtype=torch.bfloat16): fp16's range, no GradScaler.",
        )
    return Finding(
        "project.precision",
        OK,
        f"{names}: no native bf16 (compute capability < 8.0)",
        "Use fp16 with torch.amp.GradScaler; bf16 here is emulated and slow.",
    )


def check_alloc_conf(facts: dict) -> Finding:
    """project.alloc_conf: PYTORCH_CUDA_ALLOC_CONF set against fragmentation."""
    fid = "project.alloc_conf"
    env = facts.get("env", {})
    value = env.get("PYTORCH_CUDA_ALLOC_CONF") or env.get("PYTORCH_ALLOC_CONF")
    if not facts.get("torch", {}).get("cuda") or not facts.get("device_nodes"):
        return Finding(fid, OK, "not needed: no CUDA torch or no GPU in this project")
    if value:
        return Finding(fid, OK, f"PYTORCH_CUDA_ALLOC_CONF={value!r}")
    return Finding(
        fid,
        WARN,
        "PYTORCH_CUDA_ALLOC_CONF is unset: a fragmented cache can raise "
        "'CUDA out of memory' with gigabytes 'reserved but unallocated'",
        "Add `ENV PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` to the project's Dockerfile.",
    )


def analyze(facts: dict) -> list[Finding]:
    """Every in-project finding from the probe's facts."""
    facts = normalize(facts)
    out = [
        libs.check_copies(facts, "cudart"),
        libs.check_copies(facts, "cudnn"),
        check_visible_devices(facts),
        check_torch(facts),
    ]
    gpus = torch_gpus(facts)
    t = facts.get("torch", {})
    if gpus and t.get("version"):
        value = facts.get("env", {}).get("TORCH_CUDA_ARCH_LIST")
        out.append(
            cuda.check_torch_arch("project.torch_arch", t["version"], t.get("arch_flags"), gpus)
        )
        out.append(cuda.check_build_arch_list("project.build_arch_list", value, t["version"], gpus))
    precision = check_precision(facts)
    out += [precision] if precision else []
    out.append(check_alloc_conf(facts))
    return out


# --- finding the project's container and image from the hub's records, and probing ---


@dataclass(frozen=True)
class Recorded:
    """The project's last image that built, as the hub recorded it, and its image ID now."""

    tag: str
    image_id: str


def recorded_image(dk: host.Docker, hub: Layout, user: str, project: str) -> Recorded | None:
    """The image the hub recorded for the project (``image.json`` in its hub-owned state
    folder), if it is still here. Never an image's labels: a Dockerfile sets those."""
    record = Project(hub.projects_root, user, project, hub.state_root)
    good = projectimage.last_good(record, repo=hub.image_repo)
    if good is None:
        return None
    image_id = images.image_id(dk.call, good.tag)
    return Recorded(good.tag, image_id) if image_id else None


def find_container(dk: host.Docker, name: str) -> dict | None:
    """The container of exactly this name (the one the spawner gives the project's)."""
    try:
        found = dk.call("inspect_container", name)
    except docker.errors.NotFound:
        return None
    return found if found.get("Name") == f"/{name}" else None


def _failed(fid: str, seen: str, fix: str) -> list[Finding]:
    return [Finding(fid, FAIL, seen, fix)]


def check_spec(spec: str) -> tuple[str, str] | None:
    """(user, project) of ``spec`` = USER/PROJECT, both names the hub could have given."""
    user, _, name = spec.partition("/")
    if not user.isprintable() or len(user) > 100 or not name:
        return None
    try:
        return safe_owner(user), project_name(name)
    except ProjectError:
        return None


def project_findings(
    dk: host.Docker,
    hub: Layout,
    probes: sandbox.ProbeInputs,
    spec: str,
    gpus: objects.GpuAssignment | None,
) -> list[Finding]:
    """All in-project findings for ``spec`` = USER/PROJECT: probed in the running container
    the hub started for it (by its exact name) when that runs the image the hub recorded,
    else in a throwaway probe container of that image, given ``gpus`` (every GPU, the way
    gpulab gives them)."""
    names = check_spec(spec)
    if names is None:
        return _failed(
            "project.container",
            f"{shown(spec)!r} is not USER/PROJECT",
            "Name the project as USER/PROJECT, e.g. `--project alice/one`.",
        )
    user, project = names
    name = sandbox.container_name(probes, user, project)
    note = where = ""
    try:
        recorded = recorded_image(dk, hub, user, project)
        container = find_container(dk, name)
        running = container is not None and container["State"].get("Running")
        if running and recorded and container.get("Image") == recorded.image_id:
            where = f"the running container {name}"
            facts = sandbox.exec_probe(dk, container["Id"], probes)
        elif recorded is None:
            what = (
                "is running, but the hub has no record of its image"
                if running
                else ("is not running and has no image")
            )
            return _failed(
                "project.container",
                f"project {spec} {what}",
                f"Start {spec} once from the hub (its image is built and recorded then), "
                "or check the name.",
            )
        else:
            if running:
                note = (
                    f"; its running container {name} does not run that image, so it was not probed"
                )
            given = f" with {len(gpus.uuids)} GPU(s)" if gpus else ""
            where = f"a throwaway container of its image {recorded.tag}{given}" + (
                note or " (the project is not running)"
            )
            facts = sandbox.run_probe(dk, recorded.image_id, ["project"], probes, gpus)
    except answer.Unreadable as e:
        return _failed(
            "project.container",
            f"probing {spec} in {where}: {e}",
            "Nothing the image answered was used. Check what the image's `python3` prints "
            "(a sitecustomize.py, a wrapper script) and rebuild it from the project's Dockerfile.",
        )
    except answer.ProbeError as e:
        return _failed(
            "project.container",
            f"probing {spec} in {where}: {e}",
            "The image needs a python3 on its PATH (gpulab's base image has one) that answers "
            "within 40 s; if Docker refused the container, see security.network.",
        )
    except sandbox.DOCKER_ERRORS as e:
        return _failed("project.container", f"Docker: {sandbox.short(e)}", "See docker.engine.")
    seen = f"{spec}: checked in {where}, Python {facts['python']}"
    if note:
        return [
            Finding(
                "project.container",
                WARN,
                seen,
                f"Restart {spec} from the hub so that it runs the image the hub recorded.",
            ),
            *analyze(facts),
        ]
    return [Finding("project.container", OK, seen), *analyze(facts)]
