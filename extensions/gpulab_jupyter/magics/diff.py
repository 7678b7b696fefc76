"""``%gpu_diff``: what this environment has that the Dockerfile does not, and the reverse.

"Added here" means installed after the container started (a distribution whose
metadata folder is newer than the container's first process), which is what a
rebuild would lose. ``GPULAB_ENV_SINCE`` (seconds since the epoch) overrides
that moment.
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import time
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from . import dockerfile, pipenv


def container_start() -> float | None:
    """When PID 1 of this (container's) PID namespace started, in epoch seconds."""
    try:
        fields = Path("/proc/1/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])
        boot = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, IndexError, ValueError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def since() -> float | None:
    value = os.environ.get("GPULAB_ENV_SINCE", "")
    try:
        moment = float(value)
    except ValueError:
        moment = math.nan  # unset or not a number: the container's start instead
    return moment if math.isfinite(moment) and moment >= 0 else container_start()


def _requires(dist: pipenv.Dist) -> set[str]:
    names = set()
    for text in importlib.metadata.PathDistribution(Path(dist.path)).requires or []:
        try:
            names.add(canonicalize_name(Requirement(text).name))
        except InvalidRequirement:
            continue
    return names


def recorded(text: str) -> tuple[dict[str, str], set[str]]:
    """(managed block {name: requirement}, names that the user's own RUN lines install)."""
    managed = dockerfile.managed_packages(text)
    head, block, tail = dockerfile.split(text)
    own = set()
    lines = [ln.rstrip("\r\n") for ln in head + tail]
    for group in dockerfile.logical(lines):
        for req in dockerfile.pip_requirements(dockerfile.instruction_text(group)):
            name = dockerfile.requirement_name(req)
            if name:
                own.add(name)
    return managed, own


def _pinned(req: str) -> str:
    try:
        spec = Requirement(req).specifier
    except InvalidRequirement:
        return ""
    pins = [s.version for s in spec if s.operator == "=="]
    return pins[0] if pins else ""


def compute(project_dir: Path) -> dict:
    text = (project_dir / "Dockerfile").read_bytes().decode("utf-8", "surrogateescape")
    managed, own = recorded(text)
    env = pipenv.snapshot()
    moment = since()
    new = {n: d for n, d in env.items() if moment is None or os.stat(d.path).st_mtime > moment}
    deps = set().union(*(_requires(d) for d in new.values())) if new else set()
    roots = [d for n, d in sorted(new.items()) if n not in deps]
    unrecorded = [d for d in roots if d.name not in managed and d.name not in own]
    missing = []
    for name, req in managed.items():
        want = _pinned(req)
        have = env[name].version if name in env else ""
        if not have or (want and have != want):
            missing.append({"name": name, "requirement": req, "installed": have})
    return {
        "since": moment,
        "unrecorded": [{"name": d.name, "version": d.version} for d in unrecorded],
        "dependencies": sorted(n for n in new if n in deps),
        "missing": missing,
    }


def render(diff: dict) -> str:
    out = []
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(diff["since"])) if diff["since"] else ""
    if diff["unrecorded"]:
        out.append(
            "Installed in this environment"
            + (f" since {when}" if when else "")
            + " but not in the Dockerfile (a rebuild would lose them):"
        )
        out += [f"    {d['name']} {d['version']}" for d in diff["unrecorded"]]
        pins = " ".join(f"{d['name']}=={d['version']}" for d in diff["unrecorded"])
        out.append(f"Record them with:\n    %gpu_install {pins}")
    else:
        out.append("Everything installed here is in the Dockerfile.")
    if diff["missing"]:
        out.append("In the Dockerfile's managed block but not installed here as written:")
        for m in diff["missing"]:
            have = f"installed: {m['installed']}" if m["installed"] else "not installed"
            out.append(f"    {m['requirement']} ({have})")
        out.append("Restart the project to rebuild its image, or install them with:")
        out.append("    %gpu_install " + " ".join(m["requirement"] for m in diff["missing"]))
    return "\n".join(out)


def gpu_diff(project_dir: Path) -> dict:
    diff = compute(project_dir)
    print(render(diff))
    return diff
