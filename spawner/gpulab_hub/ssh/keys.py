"""Each user's SSH public keys, kept by the hub: what the gateway lets in.

One file per user, ``<keys_dir>/<user>.json`` (``{"version": 1, "keys": [{"openssh":
..., "added": ...}]}``), in the hub's private folder. Users add and delete keys on
/hub/gpulab/ssh (web.py); the gateway (another process) only reads them with
:meth:`KeyStore.login_keys` (a key logs in only the account that added it first).
Files are written atomically under one file lock for the whole folder (a key may be
on one account only, so adding checks every user's file under it) and read bounded,
without following a link; a damaged file gives no keys (no way in) and is moved aside
by the next change.

What is taken: one OpenSSH public key line ``type base64 [comment]`` of an allowed
type (:data:`ALGORITHMS`; RSA from :data:`MIN_RSA_BITS` bits), parsed by asyncssh and
kept as asyncssh exports it, with its comment reduced to plain characters. Refused,
each with a message in the user's words (:class:`KeyRefused`): a private key pasted
by mistake, ``authorized_keys`` options before the key (``from=``, ``command=``...),
other key types, text over :data:`MAX_TEXT`, more than :data:`MAX_KEYS` keys, a key
the user has already, and a key already on another account (so a key names one
person).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from gpulab_hub import blocking, jsonfile, stateversion
from gpulab_hub.accounts import USERNAME_PATTERN

LOG = logging.getLogger("gpulab.ssh")

ALGORITHMS = (
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
    "ssh-rsa",
)
MIN_RSA_BITS = 2048
MAX_TEXT = 16 * 1024  # bytes of one pasted key
MAX_KEYS = 20  # per user
MAX_FILE = 1 << 20  # bytes of one user's file, read at most
MAX_COMMENT = 100
SUFFIX = ".json"
KIND = stateversion.KINDS["ssh-keys"]  # the files' format (stateversion.py)
LOCK = ".keys.lock"

_TYPE = re.compile(r"[a-z0-9][a-z0-9.@-]{2,63}")
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")
_NOT_COMMENT = re.compile(r"[^A-Za-z0-9 ._@+:=,()/#-]")
_KNOWN = re.compile(r"(?:ssh|ecdsa|sk|rsa|x509v3|pgp|spki)-")  # key types gpulab refuses
_PRIVATE = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----|PuTTY-User-Key-File-")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

MAKE_ONE = "Make one with: ssh-keygen -t ed25519"
PASTE = "paste the one line of your .pub file (for example ~/.ssh/id_ed25519.pub)"


class KeyRefused(ValueError):
    """A key the store does not take; ``str()`` says why, in the user's words."""


@dataclass(frozen=True)
class StoredKey:
    openssh: str  # "type base64 comment", one line, as asyncssh exports it
    algorithm: str  # "ssh-ed25519"
    comment: str
    fingerprint: str  # "SHA256:..."
    added: float  # epoch seconds


def valid_user(user) -> bool:
    return isinstance(user, str) and re.fullmatch(USERNAME_PATTERN, user) is not None


def _check_user(user) -> str:
    if not valid_user(user):
        raise ValueError(f"not a gpulab account name: {user!r}")
    return user


def clean_comment(comment: str) -> str:
    """The key's comment in plain characters, at most MAX_COMMENT of them."""
    return " ".join(_NOT_COMMENT.sub("", comment).split())[:MAX_COMMENT]


def parse(text: str, added: float | None = None) -> StoredKey:
    """The public key ``text`` (one OpenSSH line) as a StoredKey, or KeyRefused."""
    import asyncssh

    if not isinstance(text, str) or not text.strip():
        raise KeyRefused(f"Paste your public key: {PASTE}.")
    if len(text.encode("utf-8", "surrogatepass")) > MAX_TEXT:
        raise KeyRefused(
            f"That is too long for an SSH public key (at most {MAX_TEXT >> 10} KiB): {PASTE}."
        )
    if _PRIVATE.search(text):
        raise KeyRefused(
            "That is a private key: paste the .pub file. Keep the private key on your "
            "computer; if you pasted it where others can read it, make a new key pair."
        )
    if _CONTROL.search(text):
        raise KeyRefused(f"That text holds characters no SSH public key has: {PASTE}.")
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if len(lines) > 1:
        raise KeyRefused(f"Paste one key at a time: that text has {len(lines)} lines.")
    words = lines[0].split()
    kind = words[0]
    if not _TYPE.fullmatch(kind):
        if any(_TYPE.fullmatch(w) and w in ALGORITHMS for w in words[1:]):
            raise KeyRefused(
                'Paste the key alone: gpulab takes no options such as from="..." or '
                'command="..." before it.'
            )
        raise KeyRefused(f"That is not an SSH public key: {PASTE}.")
    if kind not in ALGORITHMS:
        if any(w in ALGORITHMS for w in words[1:]):
            raise KeyRefused(
                "Paste the key alone: gpulab takes no options (such as restrict or "
                "no-pty) before it."
            )
        if not _KNOWN.match(kind):
            raise KeyRefused(f"That is not an SSH public key: {PASTE}.")
        raise KeyRefused(
            f"gpulab does not take {kind} keys. It takes ssh-ed25519, ecdsa-sha2-nistp256/"
            f"384/521, security-key (sk-...) keys and ssh-rsa keys of at least {MIN_RSA_BITS} "
            f"bits. {MAKE_ONE}"
        )
    if len(words) < 2 or not _BASE64.fullmatch(words[1]):
        raise KeyRefused(f"That is not a whole SSH public key: {PASTE}.")
    try:
        key = asyncssh.import_public_key(f"{kind} {words[1]}")
    except (asyncssh.KeyImportError, ValueError, TypeError) as e:
        raise KeyRefused(f"That is not a whole SSH public key: {PASTE}.") from e
    algorithm = key.get_algorithm()
    algorithm = algorithm.decode() if isinstance(algorithm, bytes) else str(algorithm)
    if algorithm != kind:
        raise KeyRefused(f"That is not a whole SSH public key: {PASTE}.")
    if algorithm == "ssh-rsa":
        bits = key.pyca_key.key_size
        if bits < MIN_RSA_BITS:
            raise KeyRefused(
                f"That RSA key has {bits} bits; gpulab takes RSA keys of at least "
                f"{MIN_RSA_BITS} bits. {MAKE_ONE}"
            )
    comment = clean_comment(" ".join(words[2:]))
    key.set_comment(comment or None)
    openssh = key.export_public_key("openssh").decode("ascii").strip()
    return StoredKey(
        openssh=openssh,
        algorithm=algorithm,
        comment=comment,
        fingerprint=key.get_fingerprint("sha256"),
        added=time.time() if added is None else float(added),
    )


def _blob(openssh: str) -> str:
    """The key itself (its base64 part) of an OpenSSH line: the same key has the same
    blob whatever its comment (lines are stored as asyncssh exports them)."""
    words = openssh.split()
    return words[1] if len(words) > 1 else openssh


class KeyStore:
    """Users' public keys, one file each under ``keys_dir`` (see the module's doc)."""

    def __init__(self, keys_dir: str | Path, log: logging.Logger | None = None):
        self.dir = Path(keys_dir)
        self.log = log or LOG
        self._thread_lock = threading.RLock()
        self._file_lock = None

    def _locked(self):
        """The keys folder's lock (blocking work: never on the event loop); it gives up
        with blocking.Busy, in the user's words, when another change holds it too long."""
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self._file_lock is None:
            self._file_lock = blocking.file_lock(self.dir / LOCK, "the SSH keys record")
        return self._file_lock

    # --- reading --------------------------------------------------------------------
    def _read_raw(self, user: str) -> bytes | None:
        """The bytes of the user's file, None where there is none; OSError/ValueError
        where it is a link, not a regular file or too big."""
        try:
            dir_fd = os.open(self.dir, _DIR_FLAGS)
        except FileNotFoundError:
            return None
        try:
            try:
                fd = os.open(user + SUFFIX, _FILE_FLAGS, dir_fd=dir_fd)
            except FileNotFoundError:
                return None
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise ValueError("it is a link") from e
                raise
        finally:
            os.close(dir_fd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ValueError("it is not a regular file")
            data = os.read(fd, MAX_FILE + 1)
            while data and len(data) <= MAX_FILE:
                more = os.read(fd, MAX_FILE + 1 - len(data))
                if not more:
                    break
                data += more
            if len(data) > MAX_FILE:
                raise ValueError(f"it is over {MAX_FILE >> 10} KiB")
            return data
        finally:
            os.close(fd)

    def _entries(self, user: str) -> list[dict]:
        """The user's records as stored; ValueError/OSError where the file is unusable."""
        raw = self._read_raw(user)
        if raw is None:
            return []
        data = json.loads(raw.decode("utf-8"))
        if isinstance(data, dict):  # a file of a newer gpulab: NewerState, left as it is
            data = KIND.upgrade(data, self.dir / (user + SUFFIX))
        if not isinstance(data, dict) or not isinstance(data.get("keys"), list):
            raise ValueError('no "keys" list in it')
        entries = data["keys"]
        for entry in entries:
            if not isinstance(entry, dict) or not isinstance(entry.get("openssh"), str):
                raise ValueError("a key without its text")
            if not isinstance(entry.get("added"), int | float):
                raise ValueError("a key without the time it was added")
        return entries[:MAX_KEYS]

    def _load(self, user: str, repair: bool = False) -> list[StoredKey]:
        """The user's keys; none where the file cannot be used (moved aside when
        ``repair``, under the lock, so that the user can add keys again)."""
        try:
            entries = self._entries(user)
        except stateversion.NewerState as e:
            self.log.error("gpulab: %s has no SSH keys: %s", user, e)
            if repair:  # never written over: it is the newer gpulab's
                raise KeyRefused(f"{e}.") from e
            return []
        except (OSError, ValueError) as e:
            if not repair:
                self.log.error(
                    "The SSH keys file of %s in %s cannot be used (%s): %s has no SSH keys "
                    "until it is repaired or they add one again.",
                    user, self.dir, e, user,
                )  # fmt: skip
                return []
            aside = jsonfile.move_aside(self.dir / (user + SUFFIX))
            self.log.error(
                "The SSH keys file of %s in %s could not be used (%s): gpulab moved it to "
                "%s and started a new one.",
                user, self.dir, e, aside.name,
            )  # fmt: skip
            return []
        keys = []
        for entry in entries:
            try:
                keys.append(parse(entry["openssh"], entry["added"]))
            except KeyRefused as e:
                self.log.error("An SSH key of %s is not taken any more (%s)", user, e)
        return keys

    def keys(self, user: str) -> list[StoredKey]:
        """The user's keys, oldest first ([] for a name no account can have)."""
        if not valid_user(user):
            return []
        return self._load(user)

    def login_keys(self, user: str) -> list[StoredKey]:
        """The keys that log ``user`` in (what the gateway asks): their keys, less any
        that another account holds since earlier or the same moment. A key names one
        person, the account that added it first; :meth:`add` refuses a key another
        account has, and this holds the rule for files that hold a key twice anyway
        (written before the rule, restored from a backup, edited by hand)."""
        mine = self.keys(user)
        if not mine:
            return []
        since = {_blob(k.openssh): k.added for k in mine}
        taken = set()
        for other in self.users():
            if other == user:
                continue
            try:
                theirs = self._entries(other)
            except (OSError, ValueError, stateversion.NewerState):
                continue  # a damaged file gives its account no keys (keys())
            for entry in theirs:
                blob = _blob(entry["openssh"])
                if blob in since and entry["added"] <= since[blob]:
                    taken.add(blob)
        for k in mine:
            if _blob(k.openssh) in taken:
                self.log.warning(
                    "gpulab: the SSH key %s of %s does not log in: another account added it "
                    "first",
                    k.fingerprint, user,
                )  # fmt: skip
        return [k for k in mine if _blob(k.openssh) not in taken]

    def users(self) -> list[str]:
        """Every user with a keys file."""
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        found = (n.removesuffix(SUFFIX) for n in names if n.endswith(SUFFIX))
        return sorted(u for u in found if valid_user(u))

    # --- changing -------------------------------------------------------------------
    def _write(self, user: str, keys: list[StoredKey]) -> None:
        path = self.dir / (user + SUFFIX)
        if not keys:
            try:
                path.unlink()
            except FileNotFoundError:
                return
            jsonfile.fsync_dir(self.dir)
            return
        entries = [{"openssh": k.openssh, "added": k.added} for k in keys]
        jsonfile.write_atomic(path, KIND.stamp({"keys": entries}))

    def add(self, user: str, text: str) -> StoredKey:
        """Add the public key ``text`` to ``user``'s keys; KeyRefused says why not."""
        _check_user(user)
        key = parse(text)
        with self._thread_lock, self._locked():
            mine = self._load(user, repair=True)
            if any(k.fingerprint == key.fingerprint for k in mine):
                raise KeyRefused(f"This key is on your account already ({key.fingerprint}).")
            if len(mine) >= MAX_KEYS:
                raise KeyRefused(
                    f"You have {len(mine)} keys, the most gpulab keeps for one account: "
                    "delete one you no longer use first."
                )
            for other in self.users():
                if other != user and any(
                    k.fingerprint == key.fingerprint for k in self._load(other)
                ):
                    raise KeyRefused(
                        "This key is already on another gpulab account, and a key names one "
                        "person: make a new key pair for this account with ssh-keygen -t "
                        "ed25519."
                    )
            self._write(user, [*mine, key])
        self.log.info("gpulab: %s added the SSH key %s", user, key.fingerprint)
        return key

    def remove(self, user: str, fingerprint: str) -> bool:
        """Delete the user's key of that fingerprint; whether there was one."""
        _check_user(user)
        with self._thread_lock, self._locked():
            mine = self._load(user, repair=True)
            kept = [k for k in mine if k.fingerprint != fingerprint]
            if len(kept) == len(mine):
                return False
            self._write(user, kept)
        self.log.info("gpulab: %s deleted the SSH key %s", user, fingerprint)
        return True

    def remove_all(self, user: str) -> None:
        """Delete every key of ``user`` (their account is deleted)."""
        _check_user(user)
        with self._thread_lock, self._locked():
            self._write(user, [])
