"""The SSH gateway's host key: made once (ed25519), kept across restarts.

The private key is ``GPULAB_SSH_HOST_KEY`` (0600, the gateway's own); the public half
is beside it as ``<path>.pub`` (what users put in known_hosts; the hub's SSH page shows
its fingerprint). Neither is ever read or written through a link, and a key file that
others may read, or that is not a regular file, is refused rather than used.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import asyncssh

from gpulab_contract import files

MAX_KEY = 64 * 1024
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class HostKeyError(Exception):
    """The host key cannot be used; ``str()`` says what to do."""


def _read_private(path: Path) -> bytes | None:
    try:
        fd = os.open(path, _READ)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise HostKeyError(f"The SSH host key {path} cannot be opened ({e}); is it a link?") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise HostKeyError(f"The SSH host key {path} is not a regular file.")
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise HostKeyError(
                f"The SSH host key {path} must belong to the hub's user with mode 0600; "
                f"fix it (chmod 600) or remove it to make a new one."
            )
        data = os.read(fd, MAX_KEY + 1)
        if len(data) > MAX_KEY:
            raise HostKeyError(f"The SSH host key {path} is too big to be a key.")
        return data
    finally:
        os.close(fd)


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` as a new file with gpulab's one atomic writer
    (gpulab_contract.files: a temporary name, then renamed over, so a link at ``path``
    is replaced, never followed)."""
    files.write_atomic(path, data, mode=mode)


def load_or_make(path: str | Path) -> asyncssh.SSHKey:
    """The host key at ``path``, made (with ``<path>.pub``) when there is none."""
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    data = _read_private(path)
    if data is None:
        key = asyncssh.generate_private_key("ssh-ed25519", comment="gpulab SSH gateway")
        _write_new(path, key.export_private_key("openssh"), 0o600)
    else:
        try:
            key = asyncssh.import_private_key(data)
        except (asyncssh.KeyImportError, ValueError) as e:
            raise HostKeyError(
                f"The SSH host key {path} is not a private key gpulab can read ({e}); "
                "remove it to make a new one (users will be told the host key changed)."
            ) from e
    public = key.export_public_key("openssh")
    pub = path.with_name(path.name + ".pub")
    try:
        current = pub.read_bytes() if not pub.is_symlink() else None
    except OSError:
        current = None
    if current != public:
        # Private like every file in the hub's folder (a public key, but the folder's rule
        # is one rule: `gpulab up` fixes anything looser).
        _write_new(pub, public, 0o600)
    return key


def fingerprint(key: asyncssh.SSHKey) -> str:
    return key.get_fingerprint("sha256")
