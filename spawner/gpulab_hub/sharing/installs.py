"""Save a copy brings the packages along: the source project's managed installs.

A notebook copied into another project imports what ``%gpu_install`` installed
in its own project. Those installs are the RUN lines of the source Dockerfile's
managed block (gpulab_jupyter.magics.dockerfile knows its markers and writes
it). Save a copy reads that block and writes the same lines into the managed
block of the destination project's Dockerfile; the destination's next build
installs them.

The source Dockerfile is hostile input (its project's users write it): it is
read through safefs (no link followed, a regular file, at most 1 MiB of UTF-8),
and a line is brought along only when the whole line is, token for token, a
line ``%gpu_install`` writes: ``RUN [BUILD VARIABLES] python -m pip install
--no-cache-dir [--no-build-isolation] [INDEX OPTIONS] REQUIREMENT [&& python -c
'import MODULES']`` or its apt-get line, each token from an allow-list and quoted
exactly as the magic quotes it. Anything else (``RUN curl … | sh``, a shell
substitution, a continuation) is left behind and counted.

The destination is written as the magic writes it: under the project's
``.gpulab/dockerfile.lock`` (the same flock), to a new file beside it that then
replaces the Dockerfile (atomic rename), only if the Dockerfile did not change
meanwhile, all through descriptors with no link followed.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import shlex
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name

from gpulab_hub.images.project import MAX_DOCKERFILE_BYTES, read_dockerfile
from gpulab_hub.projects import DOCKERFILE, Project, ProjectError, safefs
from gpulab_jupyter.magics import dockerfile
from gpulab_jupyter.magics.spec import SpecError, check_apt, check_host

LOCK_TIMEOUT = 30.0  # seconds to wait for an install running in the destination
MAX_LINE = 4096
# The build variables %gpu_install writes (gpulab_jupyter.arch.build_env, MAX_JOBS).
BUILD_VARIABLES = (
    "TORCH_CUDA_ARCH_LIST", "CMAKE_CUDA_ARCHITECTURES", "CUDAARCHS", "FLASH_ATTN_CUDA_ARCHS",
    "FORCE_CUDA", "MAX_JOBS", "CMAKE_BUILD_PARALLEL_LEVEL",
)  # fmt: skip
_VALUE = re.compile(r"[A-Za-z0-9.+;_-]{1,200}")
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?"
_EXTRAS = rf"(?:\[{_NAME}(?:,{_NAME}){{0,20}}\])?"
_PINNED = re.compile(rf"({_NAME}){_EXTRAS}==([A-Za-z0-9.+!_-]{{1,64}})")
_HOST = r"[A-Za-z0-9.-]{1,253}(?::[0-9]{1,5})?"
_URL = re.compile(rf"https?://{_HOST}(?:/[A-Za-z0-9._~%+/-]{{0,500}})?")
_DIRECT = re.compile(
    rf"({_NAME}){_EXTRAS} @ (?:git\+|hg\+|svn\+)?https?://{_HOST}/[A-Za-z0-9._~%+/@:#=-]{{1,500}}"
)
_MODULE = r"[A-Za-z_][A-Za-z0-9_]{0,99}(?:\.[A-Za-z_][A-Za-z0-9_]{0,99}){0,20}"
_IMPORT = re.compile(rf"import {_MODULE}(?:, {_MODULE}){{0,50}}")
_PACKAGE = re.compile(_NAME)
_TOKENS = re.compile(r"(?:[^\s']+|'[^']*')+")
_USER = re.compile(r"USER (?:root|[0-9]{1,10}(?::[0-9]{1,10})?|[a-z_][a-z0-9_-]{0,31})")
_APT = re.compile(
    re.escape(dockerfile.APT_RUN).replace(re.escape("{packages}"), r"([a-z0-9][ -~]{0,2000})")
)
_PRINTABLE = re.compile(rf"[ -~]{{1,{MAX_LINE}}}")


@dataclass(frozen=True)
class Install:
    name: str  # canonical distribution name
    requirement: str  # as written: name==version, or name @ URL
    line: str  # the whole RUN line, exactly as in the source
    index: str = ""  # the package index it comes from, when not the default

    @property
    def shown(self) -> str:
        return self.requirement + (f" (from {self.index})" if self.index else "")


@dataclass
class Found:
    """What a source project's managed block holds, or why it could not be read."""

    installs: list[Install] = field(default_factory=list)
    apt: list[str] = field(default_factory=list)
    skipped: int = 0  # lines of the block that are not in %gpu_install's form
    problem: str = ""

    @property
    def any(self) -> bool:
        return bool(self.installs or self.apt)

    def shown(self) -> list[str]:
        return [i.shown for i in self.installs] + [f"apt: {p}" for p in self.apt]


def _word(token: str) -> str | None:
    """The one shell word a token stands for, when it is quoted exactly as shlex.quote
    quotes it (so the token is plain text for the shell); None otherwise."""
    try:
        words = shlex.split(token)
    except ValueError:
        return None
    if len(words) != 1 or shlex.quote(words[0]) != token:
        return None
    return words[0]


def _variable(token: str) -> bool:
    key, eq, rest = token.partition("=")
    if not eq or key not in BUILD_VARIABLES:
        return False
    value = _word(rest)
    return value is not None and _VALUE.fullmatch(value) is not None


_OPTIONS = {
    "--index-url": _URL.fullmatch,
    "--extra-index-url": _URL.fullmatch,
    "--find-links": _URL.fullmatch,
    "--no-binary": _PACKAGE.fullmatch,
}


def _option_value(option: str, value: str) -> bool:
    if option == "--trusted-host":
        try:
            check_host(value)
        except SpecError:
            return False
        return True
    return bool(_OPTIONS[option](value))


def pip_install(line: str) -> Install | None:
    """The install a managed-block line makes, if the whole line is one %gpu_install
    writes (see the module doc); None for any other line."""
    if not _PRINTABLE.fullmatch(line):
        return None
    tokens = _TOKENS.findall(line)
    if " ".join(tokens) != line or not tokens or tokens[0] != "RUN":
        return None
    i = 1
    while i < len(tokens) and _variable(tokens[i]):
        i += 1
    check: list[str | None] = []
    if "&&" in tokens:  # the shell's "and then", unquoted: the import check follows
        at = tokens.index("&&")
        check = [_word(t) for t in tokens[at + 1 :]]
        tokens = tokens[:at]
        if (
            len(check) != 3
            or check[:2] != ["python", "-c"]
            or not _IMPORT.fullmatch(check[2] or "")
        ):
            return None
    words = [_word(t) for t in tokens[i:]]
    if None in words:
        return None
    head = ["python", "-m", "pip", "install", "--no-cache-dir"]
    if words[: len(head)] != head:
        return None
    rest = words[len(head) :]
    if rest[:1] == ["--no-build-isolation"]:
        rest = rest[1:]
    index = ""
    while len(rest) >= 2 and rest[0] in (*_OPTIONS, "--trusted-host"):
        if not _option_value(rest[0], rest[1]):
            return None
        if rest[0] == "--index-url":
            index = rest[1]
        rest = rest[2:]
    if not rest:
        return None
    if len(rest) != 1:
        return None
    requirement = rest[0]
    m = _PINNED.fullmatch(requirement) or _DIRECT.fullmatch(requirement)
    if m is None:
        return None
    return Install(canonicalize_name(m.group(1)), requirement, line, index)


def apt_packages(line: str) -> list[str] | None:
    """The Debian packages of a managed apt line, if the whole line is the magic's."""
    m = _APT.fullmatch(line)
    if m is None:
        return None
    names = m.group(1).split(" ")
    try:
        return [check_apt(n) for n in names]
    except SpecError:
        return None


def _block(text: str) -> list[str] | None:
    """The managed block's lines (without line endings); None when there is none."""
    lines = text.split("\n")
    starts = [n for n, ln in enumerate(lines) if ln.rstrip("\r") == dockerfile.START_MARKER]
    ends = [n for n, ln in enumerate(lines) if ln.rstrip("\r") == dockerfile.END_MARKER]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        return None
    return [ln.removesuffix("\r") for ln in lines[starts[0] + 1 : ends[0]]]


def managed_installs(text: str) -> Found:
    """What the managed block of a Dockerfile's text installs, line by line."""
    found = Found()
    block = _block(text)
    if block is None:
        return found
    for n, line in enumerate(block):
        if not line.strip() or _USER.fullmatch(line):
            continue  # blank, or the USER lines around the apt line (written anew)
        install = pip_install(line)
        apt = None if install else apt_packages(line)
        previous = block[n - 1] if n else ""
        if previous.rstrip().endswith("\\"):
            install, apt = None, None  # part of the instruction above
        if install:  # the same package again: the build ends with this one
            found.installs = [i for i in found.installs if i.name != install.name]
            found.installs.append(install)
        elif apt is not None:
            found.apt += [p for p in apt if p not in found.apt]
        else:
            found.skipped += 1
    return found


def _words(e: Exception) -> str:
    if isinstance(e, safefs.Refused) and e.reason == safefs.LINK:
        return "it is a link" if e.rel in (DOCKERFILE, "") else f"its {e.rel} is a link"
    if isinstance(e, safefs.Refused) and e.reason == safefs.TOO_BIG:
        return "it is larger than 1 MiB"
    if isinstance(e, safefs.Refused) and e.reason == safefs.MISSING:
        return "there is none"
    if isinstance(e, safefs.Refused):
        return "it is not a regular file"
    return str(e).rstrip(".")


def read_source(projects_root: str | Path, owner: str, project: str) -> Found:
    """The managed installs of ``owner/project``'s Dockerfile (problem: why none)."""
    try:
        text = read_dockerfile(Project(Path(projects_root), owner, project))
    except ProjectError as e:
        return Found(problem=f"gpulab did not read {project}'s Dockerfile ({_words(e)})")
    return managed_installs(text)


def _create(dir_fd: int, name: str, mode: int, uid: int, gid: int, data: bytes = b"") -> int:
    """A new file ``name`` (never an existing entry, never through a link), given
    ``mode`` and to ``uid:gid`` through its descriptor; the descriptor, for writing."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
    try:
        os.fchmod(fd, mode)  # whatever the hub's umask
        safefs.chown_fd(fd, uid, gid)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(name, dir_fd=dir_fd)
        raise
    return fd


def _lock(dir_fd: int, uid: int, gid: int) -> int:
    """The destination's ``.gpulab/dockerfile.lock``, held (flock, as the magic's
    FileLock); made for the project's user when missing; never through a link."""
    try:
        os.mkdir(".gpulab", 0o700, dir_fd=dir_fd)
        made = True
    except FileExistsError:
        made = False
    folder = safefs.open_dir(".gpulab", dir_fd, ".gpulab")
    try:
        if made:
            os.fchmod(folder, 0o755)
            safefs.chown_fd(folder, uid, gid)
        try:
            fd = _create(folder, "dockerfile.lock", 0o644, uid, gid)
        except FileExistsError:
            st = os.stat("dockerfile.lock", dir_fd=folder, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):  # never open a link, FIFO or device file
                raise ProjectError("its .gpulab/dockerfile.lock is not a regular file") from None
            flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            try:
                fd = os.open("dockerfile.lock", flags, dir_fd=folder)
            except OSError as e:
                raise ProjectError("its .gpulab/dockerfile.lock is not a regular file") from e
    finally:
        os.close(folder)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ProjectError("its .gpulab/dockerfile.lock is not a regular file")
    deadline = time.monotonic() + LOCK_TIMEOUT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise ProjectError(
                    f"an install in it held its Dockerfile for {LOCK_TIMEOUT:.0f} s"
                ) from None
            time.sleep(0.2)


def _replace(dir_fd: int, old: bytes, new: bytes) -> bool:
    """Replace the Dockerfile by ``new`` if it still holds ``old`` (False if it changed)."""
    st = safefs.lstat(DOCKERFILE, dir_fd, DOCKERFILE)
    tmp = f".{DOCKERFILE}.gpulab-copy-{secrets.token_hex(8)}.tmp"
    mode = stat.S_IMODE(st.st_mode) & 0o755
    os.close(_create(dir_fd, tmp, mode, st.st_uid, st.st_gid, new))
    try:
        same = safefs.read_file(dir_fd, DOCKERFILE, len(old)) == old
    except safefs.Refused:
        same = False  # it grew, or became a link: changed
    if not same:
        os.unlink(tmp, dir_fd=dir_fd)
        return False
    os.rename(tmp, DOCKERFILE, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    os.fsync(dir_fd)
    return True


def write_installs(dir_fd: int, found: Found, user: str, uid: int, gid: int) -> None:
    """Record ``found`` in the managed block of the Dockerfile of the open project folder
    ``dir_fd`` (``user``: the image's notebook user, for the USER line after apt-get)."""
    pip_lines = [(i.name, i.line) for i in found.installs]
    lock = _lock(dir_fd, uid, gid)
    try:
        for _ in range(5):
            old = safefs.read_file(dir_fd, DOCKERFILE, MAX_DOCKERFILE_BYTES)
            try:
                text = old.decode()
            except UnicodeDecodeError as e:
                raise ProjectError("its Dockerfile is not UTF-8 text") from e
            try:
                new = dockerfile.apply(text, pip_lines, found.apt, user).encode()
            except dockerfile.DockerfileError as e:
                raise ProjectError(str(e)) from e
            if new == old or _replace(dir_fd, old, new):
                return
        raise ProjectError("its Dockerfile kept changing")
    finally:
        os.close(lock)


def bring_along(project_fd: int, found: Found, user: str, uid: int, gid: int) -> str:
    """Write the installs; '' when done, else why not (in words, for the page)."""
    try:
        write_installs(project_fd, found, user, uid, gid)
    except ProjectError as e:
        return _words(e)
    except OSError as e:  # ProjectError above is what gpulab refuses; this, the disk
        return f"the file system refused it ({e.strerror})"
    return ""
