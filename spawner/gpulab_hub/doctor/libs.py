"""CUDA runtime and cuDNN copies: the 'two libcudart, undefined symbol' trap.

Works on what the in-container probe reports (``ldconfig -p``, the library
path, pip's nvidia-* wheels, what a process that imported torch has mapped).
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from gpulab_hub.doctor.findings import FAIL, OK, WARN, Finding

_LDCONFIG_LINE = re.compile(r"^\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)\s*$")
# Only the main libraries: libcudnn_ops/_cnn/... come with their libcudnn.
FAMILIES = {
    "cudart": re.compile(r"^libcudart(?:-[0-9a-f]{8})?\.so(?:\.[\d.]+)?$"),
    "cudnn": re.compile(r"^libcudnn(?:-[0-9a-f]{8})?\.so(?:\.[\d.]+)?$"),
}
_HASHED = re.compile(r"-[0-9a-f]{8}\.so")
LABELS = {"cudart": "CUDA runtime (libcudart)", "cudnn": "cuDNN (libcudnn)"}


def parse_ldconfig(text: str) -> list[tuple[str, str]]:
    """``ldconfig -p`` -> [(soname, path)], e.g. ('libcudart.so.12', '/usr/local/cuda/...')."""
    out = []
    for line in text.splitlines():
        m = _LDCONFIG_LINE.match(line)
        if m:
            out.append((m.group(1), m.group(3)))
    return out


def family(name: str) -> str | None:
    base = PurePosixPath(name).name
    for fam, pattern in FAMILIES.items():
        if pattern.match(base):
            return fam
    return None


def lib_version(name: str) -> tuple[int, ...]:
    """Version in a library's file name: libcudart.so.12.4.127 -> (12, 4, 127); .so -> ()."""
    m = re.search(r"\.so\.([\d.]+)$", PurePosixPath(name).name)
    return tuple(int(p) for p in m.group(1).split(".") if p) if m else ()


def copies(facts: dict, fam: str) -> list[dict]:
    """Distinct files of a family on the library path: [{path, real, version, where}].

    ``facts["libs"]`` is the probe's list of {path, real, where, version?}
    (``where``: ldconfig, LD_LIBRARY_PATH, pip, loaded); files that are one file
    under several names count once, with the longest version seen.
    """
    by_real: dict[str, dict] = {}
    for lib in facts.get("libs", []):
        if family(lib["path"]) != fam or lib["where"] == "loaded":
            continue
        real = lib.get("real") or lib["path"]
        version = tuple(lib.get("version") or ()) or lib_version(real) or lib_version(lib["path"])
        entry = by_real.setdefault(real, {"real": real, "paths": [], "where": set(), "version": ()})
        entry["paths"].append(lib["path"])
        entry["where"].add(lib["where"])
        if len(version) > len(entry["version"]):
            entry["version"] = version
    return list(by_real.values())


def loaded(facts: dict, fam: str) -> list[str]:
    return sorted(
        {
            lib.get("real") or lib["path"]
            for lib in facts.get("libs", [])
            if lib["where"] == "loaded" and family(lib["path"]) == fam
        }
    )


def _v(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version)) if version else "?"


def check_copies(facts: dict, fam: str) -> Finding:
    """project.<fam>: one copy (or one version) of the library, and one loaded."""
    fid = f"project.{fam}"
    label = LABELS[fam]
    found = copies(facts, fam)
    in_use = loaded(facts, fam)
    # torch's own hash-renamed copies (libcudart-1a2b3c4d.so.11.0) cannot clash.
    public = [p for p in in_use if not _HASHED.search(p)]
    listing = "; ".join(
        f"{_v(c['version'])} at {c['real']} ({', '.join(sorted(c['where']))})" for c in found
    )
    if len(public) > 1:
        return Finding(
            fid,
            FAIL,
            f"{len(public)} copies of {label} loaded in one process after "
            f"`import torch`: {', '.join(public)}",
            "Keep one: remove the other CUDA folder from LD_LIBRARY_PATH (torch "
            "brings its own through pip's nvidia-* wheels), then restart the kernel.",
        )
    if not found and not in_use:
        return Finding(fid, OK, f"no {label} on the library path")
    # Versions that disagree in what they promise (major for cuDNN, major.minor for CUDA).
    depth = 1 if fam == "cudnn" else 2
    versions = {c["version"][:depth] for c in found if c["version"]}
    seen = f"{len(found)} on the library path: {listing}" if found else "none on the library path"
    if in_use:
        seen += f"; torch loads {in_use[0]}"
    if len(versions) > 1:
        return Finding(
            fid,
            WARN,
            f"{label} in {len(versions)} versions: {seen}",
            "Remove the copy torch does not use (or its folder from LD_LIBRARY_PATH / "
            "ld.so.conf): code linked against one and run with the other fails with "
            "'undefined symbol'.",
        )
    return Finding(fid, OK, seen)
