"""An image whose userland is the host's own, for GPU hosts with no registry.

A near-empty root file system (``docker import``) plus the host's ``/usr`` and
a Python environment folder bind-mounted read-only: it starts in seconds and
runs the host's own Python and torch. Used to check GPU isolation and to time
spawns on GPU hosts where no base image can be pulled.
"""

from __future__ import annotations

import io
import tarfile

from gpulab_hub import images

DIRS = ("usr", "opt", "tmp", "etc", "proc", "sys", "dev", "workspace", "data", "root", "run")
LINKS = {"bin": "usr/bin", "lib": "usr/lib", "lib64": "usr/lib64", "sbin": "usr/sbin"}
ETC = {
    "etc/passwd": "root:x:0:0:root:/root:/bin/sh\njovyan:x:1000:100::/workspace:/bin/sh\n",
    "etc/group": "root:x:0:\nusers:x:100:\n",
    "etc/hosts": "127.0.0.1 localhost\n",
}


def rootfs_tar() -> bytes:
    """The near-empty root file system as a tar archive (pure)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in DIRS:
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        for name, target in LINKS.items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        for name, text in ETC.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def ensure_image(docker_call, name: str) -> str:
    """Import the near-empty root file system as ``name`` (once)."""
    if not images.image_id(docker_call, name):
        repo, _, tag = name.rpartition(":")
        docker_call("import_image_from_data", rootfs_tar(), repository=repo, tag=tag)
    return name


def binds(python_env: str = "/opt/torch") -> dict[str, dict[str, str]]:
    """The host folders such a container needs, read-only."""
    return {
        "/usr": {"bind": "/usr", "mode": "ro"},
        python_env: {"bind": python_env, "mode": "ro"},
    }
