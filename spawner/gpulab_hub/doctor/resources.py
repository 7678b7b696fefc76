"""Memory and swap for CUDA extension builds (MAX_JOBS), WSL2 limits, disk, HF cache."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from gpulab_contract import arch
from gpulab_hub.doctor.findings import FAIL, OK, WARN, Finding

GIB = 2**30
# Free space below which builds fail (fail) or soon will (warn): a CUDA + torch
# image is 10-20 GiB, and a build needs room for its layers on top.
DOCKER_DISK = (10, 30)
HOME_DISK = (2, 10)
WSL_MIN_GIB = 16


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo -> {key: bytes}."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"(\w+(?:\(\w+\))?):\s+(\d+)(?:\s+kB)?", line)
        if m:
            out[m.group(1)] = int(m.group(2)) * (1024 if line.rstrip().endswith("kB") else 1)
    return out


def gib(n: int | float) -> str:
    return f"{n / GIB:.1f} GiB"


def check_memory(meminfo_text: str, cpus: int) -> Finding:
    """host.memory: memory (and swap) for compiling CUDA extensions; the MAX_JOBS it implies."""
    m = parse_meminfo(meminfo_text)
    avail = m.get("MemAvailable", m.get("MemFree", 0))
    swap = m.get("SwapTotal", 0)
    # the MAX_JOBS %gpu_install sets for the same memory and CPUs
    jobs = arch.max_jobs(avail, cpus)
    seen = (
        f"{gib(avail)} of {gib(m.get('MemTotal', 0))} memory available, swap {gib(swap)}, "
        f"{cpus} CPUs: CUDA extension builds run with MAX_JOBS={jobs}"
    )
    if avail < arch.JOB_GIB * GIB:
        return Finding(
            "host.memory",
            WARN,
            seen + f" and even one job may not fit in {arch.JOB_GIB:g} GiB",
            "Free memory or add swap (e.g. a 16 GiB "
            "swap file) before compiling CUDA extensions (flash-attn, pytorch3d), "
            "or the OOM killer ends the build or the whole machine stalls.",
        )
    if swap == 0 and avail < 2 * arch.JOB_GIB * GIB:
        return Finding(
            "host.memory",
            WARN,
            seen + "; no swap to absorb a peak",
            "Add swap (e.g. `fallocate -l 16G /swapfile && mkswap /swapfile && "
            "swapon /swapfile`) so a compile peak slows down instead of being killed.",
        )
    return Finding("host.memory", OK, seen)


# --- WSL2 ---


def is_wsl2(proc_version: str, environ) -> bool:
    text = proc_version.lower()
    return (
        "microsoft" in text
        and ("wsl2" in text or "microsoft-standard" in text)
        or bool(environ.get("WSL_DISTRO_NAME") and "microsoft" in text)
    )


def parse_wslconfig(text: str) -> dict[str, str]:
    """The [wsl2] section of a .wslconfig (INI, keys case-insensitive, # and ; comments)."""
    section, out = "", {}
    for raw in text.splitlines():
        line = re.split(r"\s[#;]|^[#;]", raw, maxsplit=1)[0].strip()
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip().lower()
        elif "=" in line and section == "wsl2":
            key, value = line.split("=", 1)
            out[key.strip().lower()] = value.strip().strip('"')
    return out


def find_wslconfig(users_dir: str = "/mnt/c/Users", environ=os.environ) -> Path | None:
    """The Windows user's .wslconfig, seen from inside WSL."""
    user = environ.get("USER", "")
    candidates = sorted(Path(users_dir).glob("*/.wslconfig")) if Path(users_dir).is_dir() else []
    for c in candidates:
        if c.parent.name.lower() == user.lower():
            return c
    return candidates[0] if candidates else None


def check_wsl2(meminfo_text: str, wslconfig_text: str | None, wslconfig_path: str) -> Finding:
    """host.wsl2: the memory WSL2 lets this Linux use, and the .wslconfig change that lifts it."""
    total = parse_meminfo(meminfo_text).get("MemTotal", 0)
    swap = parse_meminfo(meminfo_text).get("SwapTotal", 0)
    conf = parse_wslconfig(wslconfig_text or "")
    if "memory" in conf:
        source = f"memory={conf['memory']} in {wslconfig_path}"
    elif wslconfig_text is not None:
        source = f"{wslconfig_path} sets no memory: WSL2's default, half of Windows' memory"
    else:
        source = "no .wslconfig found: WSL2's default, half of Windows' memory"
    seen = f"WSL2 gives this Linux {gib(total)} memory and {gib(swap)} swap ({source})"
    want = max(WSL_MIN_GIB, int(total / GIB) * 2)
    fix = (
        f"In Windows, set `[wsl2]` `memory={want}GB` and `swap=16GB` in "
        f"%UserProfile%\\.wslconfig (at most what the PC has), then run `wsl --shutdown`."
    )
    if total < WSL_MIN_GIB * GIB:
        return Finding(
            "host.wsl2",
            WARN,
            seen + f": under {WSL_MIN_GIB} GiB, CUDA extension "
            "compiles get killed (and can take Windows down with them)",
            fix,
        )
    return Finding("host.wsl2", OK, seen)


# --- disk ---


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_disk(fid: str, what: str, path: str, limits: tuple[int, int]) -> Finding:
    """Free space where ``what`` lives: fail under limits[0] GiB, warn under limits[1] GiB."""
    target = _existing(Path(path))
    usage = shutil.disk_usage(target)
    seen = f"{what} at {path}: {gib(usage.free)} free of {gib(usage.total)}"
    fail_gib, warn_gib = limits
    fix = (
        f"Free space on the disk holding {path} (`docker system prune` removes stopped "
        "containers, dangling images and build cache), or move it to a larger disk."
    )
    if usage.free < fail_gib * GIB:
        return Finding(fid, FAIL, seen + f": under {fail_gib} GiB, builds and downloads fail", fix)
    if usage.free < warn_gib * GIB:
        return Finding(
            fid, WARN, seen + f": under {warn_gib} GiB, a CUDA image build may not fit", fix
        )
    return Finding(fid, OK, seen)


def check_docker_disk(info: dict) -> Finding:
    root = info.get("DockerRootDir", "")
    if not root or not Path(root).exists():
        return Finding(
            "disk.docker",
            OK,
            f"Docker's data root {root or '?'} is not on this "
            "machine's file system (a remote engine or Docker Desktop): not measured",
        )
    return check_disk(
        "disk.docker", "Docker's data root (images, build cache, volumes)", root, DOCKER_DISK
    )


def check_hf_cache(volumes: list[str], docker_root: str, hf_mount: str, environ) -> Finding:
    """host.hf_cache: where Hugging Face downloads go, and that it is on a roomy disk."""
    where = Path(docker_root or "/var/lib/docker") / "volumes"
    seen = (
        f"each user's Hugging Face cache is a Docker volume mounted at {hf_mount} (HF_HOME): "
        f"{len(volumes)} volume(s) now, under {where}"
    )
    if environ.get("HF_HOME"):
        seen += f"; this shell's HF_HOME is {environ['HF_HOME']}"
    if where.exists():
        free = shutil.disk_usage(_existing(where)).free
        seen += f", {gib(free)} free there"
        if free < 50 * GIB:
            return Finding(
                "host.hf_cache",
                WARN,
                seen + ": one 7B model takes about 15 GiB",
                "Move Docker's data root to a larger disk (`data-root` in "
                "/etc/docker/daemon.json) or prune old models from the volumes.",
            )
    return Finding("host.hf_cache", OK, seen)
