"""Reading pip's output: the stage it is in, and the lines a user needs when it fails."""

from __future__ import annotations

import re

from packaging.utils import canonicalize_name

from gpulab_contract.text import CONTROL, strip_ansi

_BOX = re.compile(r"^[\s│║|╰─>×]+")
_KEEP = re.compile(
    r"\berror\b|\bfatal\b|Killed|No module named|undefined reference|not found|"
    r"No matching distribution|Could not find a version|conflict|\(constraint\)|depends on|"
    r"ResolutionImpossible|Unsupported gpu architecture|CUDA_HOME|Permission denied|"
    r"No space left|timed out|Traceback|Exception",
    re.IGNORECASE,
)
_NOISE = re.compile(
    r"This error originates from a subprocess|See above for output|subprocess-exited-with-error|"
    r"^hint:|^note:|To fix this you could try|loosen the range|remove package versions|"
    r"dependency-resolution|^\$ |Running command|did not run successfully|Failed to build|"
    r"^ERROR: Failed building wheel|^ERROR: Could not build wheels|pip's dependency resolver|"
    r"Exception information:|^Traceback \(most recent call last\):$|^\s*File \"|"
    r"Getting requirements to build|Preparing metadata|exit code:|metadata-generation-failed|"
    r"Encountered error while generating package metadata|^ERROR: Command errored out",
    re.IGNORECASE,
)
BUILD_STARTS = (
    "Building wheel",
    "Building wheels",
    "Running setup.py",
    "Preparing metadata",
    "Getting requirements to build",
)
_CONSTRAINT = re.compile(r"The user requested \(constraint\) (\S+)")
_NAME = r"([A-Za-z0-9][A-Za-z0-9._-]*)"
_BUILDING = re.compile(
    rf"(Building wheel for|Created wheel for|Running setup\.py install for) {_NAME}"
)
_KILLED = re.compile(r"^\s*Killed\s*$|Killed signal terminated program", re.MULTILINE)
_CREATED = re.compile(rf"Created wheel for {_NAME}: filename=(\S+\.whl)")
_INSECURE = re.compile(r"The repository located at (\S+) is not a trusted or secure host")
_CUDA_BUILD = re.compile(r"\bnvcc\b|\bcuda\b|TORCH_CUDA_ARCH_LIST|CUDAExtension", re.IGNORECASE)


def plain(line: str) -> str:
    """A line as a terminal would show it: no escape codes, no control characters;
    after a carriage return, only what overwrote the line."""
    line = strip_ansi(line)
    if "\r" in line:
        line = next((part for part in reversed(line.split("\r")) if part.strip()), "")
    return CONTROL.sub("", line)


def stage_of(line: str) -> str | None:
    """The install stage a pip output line announces, if any."""
    text = line.strip()
    if text.startswith(("Collecting", "Looking in", "Processing", "Requirement already")):
        return "resolving"
    if text.startswith(BUILD_STARTS):
        return "building"
    if text.startswith("Installing collected packages"):
        return "installing"
    return None


def relevant(lines: list[str], limit: int = 15) -> list[str]:
    """The lines that say what went wrong, without pip's boxes and notes."""
    picked: list[str] = []
    for raw in lines:
        line = _BOX.sub("", raw).rstrip()
        if not line or _NOISE.search(line) or not _KEEP.search(line):
            continue
        if line not in picked:
            picked.append(line)
    if not picked:
        picked = [_BOX.sub("", ln).rstrip() for ln in lines if ln.strip()][-10:]
    return picked[-limit:]


def constraint_conflicts(lines: list[str]) -> list[str]:
    """Torch-stack pins that the resolver could not keep (``torch==2.4.0``)."""
    found = []
    for line in lines:
        m = _CONSTRAINT.search(line)
        if m and m.group(1) not in found:
            found.append(m.group(1))
    return found


def built_from_source(lines: list[str]) -> set[str]:
    """Canonical names of the distributions pip compiled (built a wheel for)."""
    return {canonicalize_name(m.group(2)) for ln in lines if (m := _BUILDING.search(ln))}


def compiled(lines: list[str]) -> set[str]:
    """Canonical names of the distributions pip built into a platform wheel here (compiled
    code); a build without a "Created wheel" line counts as compiled."""
    built = built_from_source(lines)
    pure = set()
    for line in lines:
        m = _CREATED.search(line)
        if m and m.group(2).endswith("-none-any.whl"):
            pure.add(canonicalize_name(m.group(1)))
    return built - pure


def insecure_hosts(lines: list[str]) -> list[str]:
    """Hosts of plain-http indexes pip ignored because they are not trusted."""
    found = []
    for line in lines:
        m = _INSECURE.search(line)
        if m and m.group(1) not in found:
            found.append(m.group(1))
    return found


def cuda_build(lines: list[str]) -> bool:
    """Whether a failed build was compiling CUDA code (its log speaks of nvcc or CUDA)."""
    return any(_CUDA_BUILD.search(line) for line in lines)


def needs_torch_at_build(lines: list[str]) -> bool:
    text = "\n".join(lines)
    return "No module named 'torch'" in text and "Getting requirements to build" in text


def missing_build_backend(lines: list[str]) -> bool:
    text = "\n".join(lines)
    return "BackendUnavailable" in text or "Cannot import 'setuptools.build_meta'" in text


def out_of_memory(lines: list[str]) -> bool:
    return bool(_KILLED.search("\n".join(lines)))
