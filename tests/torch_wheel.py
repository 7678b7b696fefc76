"""The CPU torch wheel on this machine's disk, for the test hubs' base image.

pip's find-links (``pip config list``, or PIP_FIND_LINKS) name the folder that holds
it. The test base image installs that file (GPULAB_TORCH, images/base.py
torch_requirement), so every project of the test hubs has a CPU torch and the magics
run their torch branches in CI. Never a requirement pip would resolve from an index:
PyPI's Linux torch is a multi-GB CUDA build.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

# torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl: a CPU build for CPython 3.11,
# the Python of the test base image (Debian bookworm's).
CPU_WHEEL = re.compile(r"torch-(\d+(?:\.\d+)*)\+cpu-cp311-cp311-[A-Za-z0-9_.]+\.whl")


def find_links() -> list[str]:
    """The folders pip's configuration and environment name as find-links."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
    )
    found: list[str] = []
    for line in done.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.rpartition(".")[2] == "find-links":
            found += value.strip().strip("'\"").split()
    found += os.environ.get("PIP_FIND_LINKS", "").split()
    return list(dict.fromkeys(link.removeprefix("file://") for link in found))


def cpu_torch_wheel() -> str:
    """Path of the newest CPU torch wheel in pip's find-links folders ("" if none)."""
    wheels = []
    for link in find_links():
        folder = Path(link)
        if not folder.is_dir():
            continue
        for p in folder.iterdir():
            m = CPU_WHEEL.fullmatch(p.name)
            if m and p.is_file() and not p.is_symlink():
                wheels.append((tuple(int(x) for x in m.group(1).split(".")), str(p)))
    return max(wheels)[1] if wheels else ""
