"""The wheels that base images install, each built once per content of its source
tree: the user side (``extensions/``, gpulab-jupyter) and the contract it shares with
the hub (``contract/``, gpulab-contract), which the user side depends on.

Building it takes pip several seconds (a fresh build environment each time), and
every ``gpulab up`` needs it. The build is reproducible (hatchling: same sources,
same bytes), so a wheel kept in this machine's cache under a digest of the source
tree is the wheel a new build would make; any change to a file there makes a new
digest and a new build.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PATTERN = "gpulab_jupyter-*.whl"
CONTRACT_PATTERN = "gpulab_contract-*.whl"
# (source folder in the checkout, its wheel's file names): what project images install
PROJECT_WHEELS = (("contract", CONTRACT_PATTERN), ("extensions", PATTERN))
# Build outputs and tool caches that are not the wheel's sources (the front end's
# build output, gpulab_jupyter/labextension, is a source here: the wheel packs it).
NOT_SOURCES = {"node_modules", "lib", ".yarn", "__pycache__", "build", "dist"}
KEEP = 10  # cached wheels kept (several checkouts may share one machine's cache)


class WheelError(Exception):
    """The wheel build failed; ``str()`` says so with pip's last words."""


def source_digest(src: Path) -> str:
    """A digest of every file of the distribution's source tree (names and bytes)."""
    h = hashlib.sha256()
    for root, dirs, files in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d not in NOT_SOURCES and not d.endswith(".egg-info"))
        for name in sorted(files):
            if name.endswith((".pyc", ".tsbuildinfo")):
                continue
            path = Path(root, name)
            if path.is_symlink() or not path.is_file():
                continue
            h.update(path.relative_to(src).as_posix().encode() + b"\0")
            h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:32]


def _pip_wheel(src: Path, out_dir: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out_dir), str(src)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise WheelError(f"building the {_name(src)} wheel failed:\n" + done.stderr[-2000:])


def _name(src: Path) -> str:
    return "gpulab-contract" if Path(src).name == "contract" else "gpulab-jupyter"


def _prune(cache: Path, keep: int = KEEP) -> None:
    entries = sorted(
        (p for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".")),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in entries[keep:]:
        shutil.rmtree(old, ignore_errors=True)


def cached(src: Path, cache: Path, build=_pip_wheel, pattern: str = PATTERN) -> list[Path]:
    """The wheel(s) of ``src`` from ``cache``, built there first when its sources changed.

    A build goes to a private folder that is renamed into place whole, so two
    ``gpulab up`` at once never see half a wheel.
    """
    entry = cache / source_digest(src)
    wheels = sorted(entry.glob(pattern))
    if wheels:
        os.utime(entry)  # recently used: kept by the pruning below
        return wheels
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=cache))
    try:
        build(src, tmp)
        if not list(tmp.glob(pattern)):
            raise WheelError(f"building the {_name(src)} wheel made no {pattern} file")
        try:
            tmp.rename(entry)
        except OSError:  # another build of the same sources got there first
            if not list(entry.glob(pattern)):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _prune(cache)
    return sorted(entry.glob(pattern))


def project_wheels(repo_dir: Path, cache: Path, build=_pip_wheel) -> list[Path]:
    """The contract's wheel and the user side's, from ``cache`` (built there first when
    their sources changed): what base images install, so every project has both."""
    out: list[Path] = []
    for folder, pattern in PROJECT_WHEELS:
        out += cached(Path(repo_dir) / folder, cache, build, pattern)
    return out
