#!/usr/bin/env python3
"""gpulab's OCI runtime for the Docker engine: runc, with build steps confined.

Docker's classic builder runs each ``RUN`` step of a project's Dockerfile as root
with Docker's default capabilities (NET_RAW among them: raw sockets, ARP) and no
``no-new-privileges``, and its build API has no setting for either, nor a process
limit. So gpulab registers this program as the engine's default runtime
(``dockerd --add-runtime gpulab=<this> --default-runtime gpulab``, host.py): it
hands every call to runc unchanged, except that when runc is asked to create a
container whose cgroup parent is a gpulab build's (``gpulab-build-pids<N>``, set
only by the hub through the build API's ``cgroupparent``), it first confines the
container's OCI spec:

- capabilities: at most BUILD_CAPS (what apt/dpkg need as root inside the
  build's user namespace: owners, modes, dropping to ``_apt``); never NET_RAW,
  MKNOD, AUDIT_WRITE, SETFCAP, SETPCAP, SYS_CHROOT or NET_BIND_SERVICE;
- ``noNewPrivileges``: set-uid programs and file capabilities give nothing;
- a process limit of N (``linux.resources.pids.limit``).

Every other container passes through untouched (project containers already run
with no capabilities: objects.py). Standard library only, so it starts fast; it
never reads anything a user wrote except the spec Docker made.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys

# What a build step's root keeps (inside the engine's user namespace).
BUILD_CAPS = frozenset(
    {
        "CAP_CHOWN",
        "CAP_DAC_OVERRIDE",
        "CAP_FOWNER",
        "CAP_FSETID",
        "CAP_SETUID",
        "CAP_SETGID",
        "CAP_KILL",
    }
)
CGROUP_MARK = re.compile(r"gpulab-build-pids([1-9][0-9]{0,6})(?![0-9])")
# runc's global options that take a value (the subcommand is the first word after them)
_VALUED = {"--root", "--log", "--log-format", "--criu", "--rootless"}
RUNC_PATHS = ("/usr/sbin/runc", "/usr/bin/runc", "/usr/local/sbin/runc", "/usr/local/bin/runc")
MAX_SPEC_BYTES = 8 << 20


def subcommand(args: list[str]) -> tuple[str, int]:
    """runc's subcommand and its index in ``args`` ('' when there is none)."""
    i = 0
    while i < len(args):
        word = args[i]
        if word in _VALUED:
            i += 2
            continue
        if word.startswith("-"):
            i += 1
            continue
        return word, i
    return "", len(args)


def bundle_of(args: list[str]) -> str:
    """The ``--bundle``/``-b`` of a create/run command (runc's default: the current folder)."""
    for i, word in enumerate(args):
        if word in ("--bundle", "-b") and i + 1 < len(args):
            return args[i + 1]
        if word.startswith("--bundle="):
            return word.split("=", 1)[1]
    return "."


def build_pids_limit(spec: dict) -> int | None:
    """The process limit of a gpulab build step, from its cgroup path; None for others."""
    path = (spec.get("linux") or {}).get("cgroupsPath") or ""
    m = CGROUP_MARK.search(path) if isinstance(path, str) else None
    return int(m.group(1)) if m else None


def confine(spec: dict, pids: int) -> dict:
    """The spec of a build step, confined (see the module's docstring)."""
    process = spec.setdefault("process", {})
    caps = process.get("capabilities") or {}
    for kind in ("bounding", "effective", "permitted", "inheritable", "ambient"):
        have = caps.get(kind) or []
        caps[kind] = [c for c in have if c in BUILD_CAPS]
    process["capabilities"] = caps
    process["noNewPrivileges"] = True
    resources = spec.setdefault("linux", {}).setdefault("resources", {})
    pid_res = resources.get("pids") or {}
    have = pid_res.get("limit")
    if not isinstance(have, int) or have <= 0 or have > pids:
        pid_res["limit"] = pids
    resources["pids"] = pid_res
    return spec


def confine_bundle(bundle: str) -> bool:
    """Confine the bundle's config.json in place when it is a build step's; whether it was."""
    path = os.path.join(bundle, "config.json")
    with open(path, "rb") as f:
        data = f.read(MAX_SPEC_BYTES + 1)
    if len(data) > MAX_SPEC_BYTES:
        raise ValueError(f"{path} is over {MAX_SPEC_BYTES} bytes")
    spec = json.loads(data)
    pids = build_pids_limit(spec)
    if pids is None:
        return False
    # Its own rename, not gpulab_contract.files: the engine runs this module with
    # ``python -I -S`` (the standard library only, no site packages), and runc reads the
    # spec once, right after; a crash leaves the engine's own bundle to be made again.
    tmp = path + ".gpulab"
    with open(tmp, "w") as f:
        json.dump(confine(spec, pids), f)
    os.replace(tmp, path)
    return True


def find_runc() -> str:
    for path in RUNC_PATHS:
        if os.access(path, os.X_OK):
            return path
    found = shutil.which("runc")
    if not found:
        sys.stderr.write("gpulab-build-runtime: runc is not installed\n")
        raise SystemExit(127)
    return found


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    runc = find_runc()
    command, at = subcommand(args)
    if command in ("create", "run"):
        try:
            confine_bundle(bundle_of(args[at + 1 :]))
        except (OSError, ValueError) as e:
            # Never start a build step unconfined: fail the create.
            sys.stderr.write(f"gpulab-build-runtime: cannot confine the container: {e}\n")
            raise SystemExit(1) from e
    os.execv(runc, [runc, *args])


if __name__ == "__main__":
    main()
