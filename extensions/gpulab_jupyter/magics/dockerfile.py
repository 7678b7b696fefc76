"""The managed block of a project's Dockerfile, updated safely from the project.

The block's markers, its lines and its parser are the contract's
(:mod:`gpulab_contract.managed_block`), shared with the hub's Save a copy; here is
what the project side adds: the update under a file lock, written to a temporary file
in the same folder that then replaces the Dockerfile (atomic rename), and only if the
file did not change while the new content was computed.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpulab_contract.files import write_atomic as _write_atomic
from gpulab_contract.managed_block import (
    APT_RUN,
    END_MARKER,
    START_MARKER,
    DockerfileError,
    Item,
    apply,
    apt_item,
    apt_packages,
    instruction_text,
    logical,
    managed_packages,
    parse_block,
    pip_requirements,
    requirement_name,
    split,
)

__all__ = [
    "APT_RUN",
    "END_MARKER",
    "START_MARKER",
    "DockerfileError",
    "Item",
    "apply",
    "apt_item",
    "apt_packages",
    "instruction_text",
    "logical",
    "managed_packages",
    "parse_block",
    "pip_requirements",
    "requirement_name",
    "split",
    "update",
]

LOCK_TIMEOUT = 120


def _lock_path(dockerfile: Path) -> Path:
    folder = dockerfile.parent / ".gpulab"
    try:
        folder.mkdir(exist_ok=True)
        if os.access(folder, os.W_OK):
            return folder / "dockerfile.lock"
    except OSError:
        pass
    return dockerfile.parent / f".{dockerfile.name}.lock"


def write_atomic(path: Path, data: bytes, like: os.stat_result | None) -> None:
    """Replace ``path`` by ``data``, keeping the mode (and, as root, the owner) of
    ``like``, the file it replaces."""
    mode = (like.st_mode & 0o7777) if like else 0o644
    owner = (like.st_uid, like.st_gid) if like and os.geteuid() == 0 else None
    _write_atomic(path, data, mode=mode, owner=owner)


def update(dockerfile: Path, pip_lines, apt=(), user: str = "") -> tuple[bytes, bytes]:
    """Record lines in the Dockerfile under its lock. Returns (old bytes, new bytes)."""
    from filelock import FileLock, Timeout

    dockerfile = Path(dockerfile)
    try:
        with FileLock(str(_lock_path(dockerfile)), timeout=LOCK_TIMEOUT):
            for _ in range(5):
                old = dockerfile.read_bytes()
                st = dockerfile.stat()
                new_text = apply(old.decode("utf-8", "surrogateescape"), pip_lines, apt, user)
                new = new_text.encode("utf-8", "surrogateescape")
                if new == old:
                    return old, new
                if dockerfile.read_bytes() == old:  # nobody saved it meanwhile
                    write_atomic(dockerfile, new, st)
                    return old, new
            raise DockerfileError("The Dockerfile kept changing while gpulab tried to update it.")
    except Timeout as e:
        raise DockerfileError(
            f"Another install held the Dockerfile's lock for {LOCK_TIMEOUT} s; try again."
        ) from e
    except FileNotFoundError as e:
        raise DockerfileError(f"There is no Dockerfile at {dockerfile}.") from e
