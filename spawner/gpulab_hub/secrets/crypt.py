"""The encryption of secrets: JupyterHub's own CryptKeeper (Fernet), and its key.

The key is ``JUPYTERHUB_CRYPT_KEY`` where the administrator set it (JupyterHub reads
it; several keys separated by ``;`` rotate: the first encrypts, each decrypts).
Otherwise gpulab makes one key once, at the hub's first start, in the hub's folder
(``<hub>/crypt-key``, 0600, never through a link; :func:`ensure_key`, called by
jupyterhub_config.py beside the folder's other start-up steps) and gives it to
``c.CryptKeeper.keys`` (:func:`configure_keys`, which only reads).
"""

from __future__ import annotations

import base64
import binascii
import os
import sys
from pathlib import Path

from gpulab_hub import jsonfile

KEY_FILE = "crypt-key"
KEY_ENV = "JUPYTERHUB_CRYPT_KEY"  # jupyterhub.crypto.KEY_ENV
MAX_KEY_FILE_BYTES = 4096


class SecretsUnavailable(Exception):
    """The hub cannot encrypt or decrypt secrets now; ``str()`` says why, for users."""


def key_path(hub_dir: str | Path) -> Path:
    return Path(hub_dir) / KEY_FILE


def _valid(key: str) -> bool:
    """A 32-byte key as JupyterHub takes it: URL-safe base64 (44) or hex (64)."""
    try:
        if len(key) == 44:
            return len(base64.urlsafe_b64decode(key.encode("ascii"))) == 32
        if len(key) == 64:
            return len(bytes.fromhex(key)) == 32
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return False
    return False


def read_keys(hub_dir: str | Path) -> list[str]:
    """The keys in ``<hub>/crypt-key`` (one, or several separated by ``;`` or lines);
    FileNotFoundError if there is none, ValueError if it is not a key file."""
    path = key_path(hub_dir)
    try:
        raw = jsonfile.read_regular(path, MAX_KEY_FILE_BYTES)
    except jsonfile.NotARecord as e:
        raise ValueError(f"{path} is {e}") from e
    keys = [k.strip() for k in raw.decode("ascii", "replace").replace("\n", ";").split(";")]
    keys = [k for k in keys if k]
    if not keys or not all(_valid(k) for k in keys):
        raise ValueError(f"{path} holds no valid key (32 bytes, URL-safe base64 or hex)")
    return keys


def ensure_key(hub_dir: str | Path, environ=os.environ) -> Path | None:
    """Make ``<hub>/crypt-key`` if the administrator set no ``JUPYTERHUB_CRYPT_KEY`` and
    none is there; the key file's path (None: the administrator's key is used, or no
    key could be made: the hub then starts with secrets off, and says why)."""
    if environ.get(KEY_ENV):
        return None
    path = key_path(hub_dir)
    if os.path.lexists(path):
        return path
    try:
        _make_key(path)
    except OSError as e:
        print(f"gpulab: could not make {path} ({e.strerror or e})", file=sys.stderr)
        return None
    return path


def _make_key(path: Path) -> None:
    key = base64.urlsafe_b64encode(os.urandom(32)) + b"\n"
    tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(key)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # never over a key another process made meanwhile
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)
    jsonfile.fsync_dir(path.parent)


def configure_keys(c, hub_dir: str | Path, environ=os.environ) -> str:
    """Give JupyterHub's CryptKeeper gpulab's key unless the administrator set one;
    "" or, where there is no usable key, why (the hub still starts: secrets are off)."""
    if environ.get(KEY_ENV):
        return ""
    try:
        c.CryptKeeper.keys = read_keys(hub_dir)
    except FileNotFoundError:
        return f"there is no {key_path(hub_dir)} (gpulab makes it when the hub starts)"
    except (OSError, ValueError) as e:
        return str(e)
    return ""


def _keeper():
    from jupyterhub.crypto import CryptKeeper, EncryptionUnavailable

    try:
        keeper = CryptKeeper.instance()
        keeper.check_available()
    except (EncryptionUnavailable, ValueError) as e:
        raise SecretsUnavailable(
            "Secrets are off on this hub: it has no usable encryption key "
            f"({e}). Ask its administrator (docs/secrets.md, 'The key')."
        ) from e
    return keeper


async def encrypt(value: str) -> str:
    """``value`` encrypted by JupyterHub's CryptKeeper (on its worker threads)."""
    from jupyterhub.crypto import encrypt as hub_encrypt

    _keeper()
    return (await hub_encrypt(value)).decode("ascii")


async def decrypt(token: str) -> str | None:
    """The value of an encrypted ``token``; None where no key of the hub opens it (the
    key was changed without keeping the old one: the user sets the secret again)."""
    from jupyterhub.crypto import InvalidToken
    from jupyterhub.crypto import decrypt as hub_decrypt

    _keeper()
    try:
        value = await hub_decrypt(token.encode("ascii"))
    except (InvalidToken, UnicodeEncodeError):
        return None
    return value if isinstance(value, str) else None
