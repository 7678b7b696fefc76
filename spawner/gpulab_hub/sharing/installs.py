"""Save a copy brings the packages along: the source project's managed installs.

A notebook copied into another project imports what ``%gpu_install`` installed
in its own project. Those installs are the RUN lines of the source Dockerfile's
managed block (gpulab_contract.managed_block: its markers and its parser, the same
code the magic writes it with). Save a copy reads that block, shows the person
copying every line it would write, whole, and writes the lines they tick into the
managed block of the destination project's Dockerfile; the destination's next
build installs them.

The source Dockerfile is hostile input (its project's users write it): it is
read through safefs (no link followed, a regular file, at most 1 MiB of UTF-8),
and a line is offered only when the whole line is, token for token, a line
``%gpu_install`` writes: ``RUN [BUILD VARIABLES] python -m pip install
--no-cache-dir [OPTIONS] REQUIREMENT [&& python -c 'import MODULES']`` or its
apt-get line, each token from an allow-list and quoted exactly as the magic
quotes it. Anything else (``RUN curl … | sh``, a shell substitution, a
continuation) is refused, and shown as refused with the reason.

What is copied is what is shown. A line's options are its own words: an
``--extra-index-url`` or ``--trusted-host`` the owner chose would make
``numpy==1.26.4`` come from wherever they like. So the options allowed are
``--no-build-isolation``, ``--no-binary`` of the line's own package, and the
package-source options (``--index-url``, ``--extra-index-url``,
``--find-links``, ``--trusted-host``) only for the indexes the hub's admin
allows (:class:`GpulabSaveCopy`); a line with any other option is refused. Only
a plain line (no option, no build variable, ``name==version`` from the
project's default index) is ticked for the person; every other line is shown
whole and left for them to tick. The page's choice is checked again on POST
against the lines read afresh (:func:`pick`): a line not offered, refused or
changed since is refused, and nothing is copied.

The destination is written as the magic writes it: under the project's
``.gpulab/dockerfile.lock`` (the same flock), to a new file beside it that then
replaces the Dockerfile (atomic rename), only if the Dockerfile did not change
meanwhile, all through descriptors with no link followed.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from packaging.utils import canonicalize_name
from traitlets import List, TraitError, Unicode, validate
from traitlets.config import Configurable

from gpulab_contract import managed_block
from gpulab_contract.files import write_atomic
from gpulab_hub import blocking
from gpulab_hub.images.project import MAX_DOCKERFILE_BYTES, read_dockerfile
from gpulab_hub.projects import DOCKERFILE, Project, ProjectError, safefs

# Seconds a page waits for an install running in the destination (%gpu_install holds the
# same lock, waiting up to 120 s for it: a person at a page is told sooner).
LOCK_TIMEOUT = 30.0
LOCK_NAME = "dockerfile.lock"  # in the project's .gpulab folder, as the magic's
MAX_LINE = 4096
MAX_REFUSED_SHOWN = 100  # refused lines listed on the page; the rest are counted
PREVIEW = 1000  # characters of a refused line shown
# The build variables %gpu_install writes (gpulab_contract.arch.build_env, MAX_JOBS).
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
    re.escape(managed_block.APT_RUN).replace(re.escape("{packages}"), r"([a-z0-9][ -~]{0,2000})")
)
_PRINTABLE = re.compile(rf"[ -~]{{1,{MAX_LINE}}}")
# What an allowed index URL may add under an allowed prefix: plain path segments, none
# of them "." or ".." (each starts with a character other than a dot).
_SEGMENT = r"[A-Za-z0-9_~+-][A-Za-z0-9._~+-]{0,200}"
_UNDER = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT}){{0,20}}/?")

NOT_FORM = "it is not a line %gpu_install writes"
FLAGS = ("--no-build-isolation",)  # options without a value that a line may carry
SOURCE_OPTIONS = ("--index-url", "--extra-index-url", "--find-links")  # where packages come from
TRUSTED_HOST = "--trusted-host"


class GpulabSaveCopy(Configurable):
    """What Save a copy may bring along into a copied project's Dockerfile."""

    package_indexes = List(
        Unicode(),
        config=True,
        help="""Package indexes that Save a copy may bring along. A line of the source
        project's Dockerfile that names a package source (pip's ``--index-url``,
        ``--extra-index-url``, ``--find-links``) is offered only when every such URL
        is one of these (an entry ending in ``/`` allows every URL under it, plain
        path segments only), and ``--trusted-host`` (no certificate checks) only for
        the host of one of these; any other such line is shown as refused, so no one
        can make a copied ``numpy==1.26.4`` come from an index of their own. A line
        with such an option is never ticked for the person copying: they see it
        whole and tick it themselves. Each entry an http(s) URL without a password.
        Default: none (only the image's default index).
        Example: ``c.GpulabSaveCopy.package_indexes = ["https://download.pytorch.org/whl/"]``""",
    )

    @validate("package_indexes")
    def _check_indexes(self, proposal):
        for url in proposal["value"]:
            if not _URL.fullmatch(url):
                raise TraitError(
                    f"GpulabSaveCopy.package_indexes: {url!r} is not an http(s) URL of "
                    "plain characters (no password, query or spaces)"
                )
        return proposal["value"]


def index_allowed(url: str, allowed) -> bool:
    """Whether ``url`` is one of the ``allowed`` index URLs, or under one ending in ``/``."""
    for entry in allowed:
        if url in (entry, entry.rstrip("/"), entry.rstrip("/") + "/"):
            return True
        if entry.endswith("/") and url.startswith(entry):
            if _UNDER.fullmatch(url[len(entry) :]):
                return True
    return False


def host_allowed(host: str, allowed) -> bool:
    """Whether ``host`` (``name`` or ``name:port``) is the host of an allowed index URL."""
    for entry in allowed:
        parts = urlsplit(entry)
        if host in {parts.hostname, parts.netloc}:
            return True
    return False


def preview(line: str, limit: int = PREVIEW) -> str:
    """A refused line for the page: printable, at most ``limit`` characters and a mark."""
    shown = re.sub(r"[^ -~]", "\N{REPLACEMENT CHARACTER}", line[:limit])
    return shown + (f"… ({len(line) - limit} more characters)" if len(line) > limit else "")


@dataclass(frozen=True)
class Install:
    name: str  # canonical distribution name
    requirement: str  # as written: name==version, or name @ URL
    line: str  # the whole RUN line, exactly as in the source: what is written
    options: tuple[str, ...] = ()  # pip's options on it, as written (option, value, ...)
    variables: tuple[str, ...] = ()  # build variables, as written (NAME=value)

    @property
    def index(self) -> str:
        """The package index it comes from, when not the default."""
        opts = self.options
        return next((opts[n + 1] for n, o in enumerate(opts) if o == "--index-url"), "")

    @property
    def plain(self) -> bool:
        """No option, no build variable, a pinned version from the default index: the
        only kind of line ticked for the person copying."""
        return not (self.options or self.variables) and bool(_PINNED.fullmatch(self.requirement))

    @property
    def shown(self) -> str:
        return self.requirement + (f" (from {self.index})" if self.index else "")

    def pairs(self):
        """``(option, value)`` for each option (value '' for a flag)."""
        opts, n = self.options, 0
        while n < len(opts):
            if opts[n] in FLAGS:
                yield opts[n], ""
                n += 1
            else:
                yield opts[n], opts[n + 1]
                n += 2


@dataclass(frozen=True)
class Refused:
    """A line of the managed block that is not brought along, and why (for the page)."""

    line: str  # preview(): what the page shows
    reason: str


@dataclass
class Found:
    """What a source project's managed block holds, or why it could not be read."""

    installs: list[Install] = field(default_factory=list)  # offered
    apt: list[str] = field(default_factory=list)
    refused: list[Refused] = field(default_factory=list)  # the first MAX_REFUSED_SHOWN
    refused_more: int = 0  # refused lines beyond those
    problem: str = ""

    @property
    def any(self) -> bool:
        return bool(self.installs or self.apt)

    @property
    def skipped(self) -> int:
        return len(self.refused) + self.refused_more

    def shown(self) -> list[str]:
        return [i.shown for i in self.installs] + [f"apt: {p}" for p in self.apt]

    def apt_line(self) -> str:
        """The apt-get line written for these packages (between USER lines)."""
        return managed_block.APT_RUN.format(packages=" ".join(self.apt))

    def refuse(self, line: str, reason: str) -> None:
        if len(self.refused) < MAX_REFUSED_SHOWN:
            self.refused.append(Refused(preview(line), reason))
        else:
            self.refused_more += 1


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


def _option_value(option: str, value: str) -> bool:
    """Whether ``value`` has the form %gpu_install writes for ``option``."""
    if option == TRUSTED_HOST:
        return managed_block.host_ok(value)
    if option == "--no-binary":
        return bool(_PACKAGE.fullmatch(value))
    return bool(_URL.fullmatch(value))


def parse_pip(line: str) -> Install | str:
    """The install a managed-block line makes, if the whole line has the form
    %gpu_install writes (see the module doc); else why not, in words."""
    if not _PRINTABLE.fullmatch(line):
        return NOT_FORM
    tokens = _TOKENS.findall(line)
    if " ".join(tokens) != line or not tokens or tokens[0] != "RUN":
        return NOT_FORM
    i = 1
    while i < len(tokens) and _variable(tokens[i]):
        i += 1
    variables = tuple(tokens[1:i])
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
            return NOT_FORM
    words = [_word(t) for t in tokens[i:]]
    if None in words:
        return NOT_FORM
    head = ["python", "-m", "pip", "install", "--no-cache-dir"]
    if words[: len(head)] != head:
        return NOT_FORM
    rest: list[str] = words[len(head) :]  # type: ignore[assignment]
    options: list[str] = []
    while rest and rest[0].startswith("-"):
        option = rest[0]
        if option in FLAGS:
            options.append(option)
            rest = rest[1:]
            continue
        if option not in (*SOURCE_OPTIONS, TRUSTED_HOST, "--no-binary"):
            return f"its pip option {preview(option, 100)} is not one Save a copy brings along"
        if len(rest) < 2 or not _option_value(option, rest[1]):
            return NOT_FORM
        options += rest[:2]
        rest = rest[2:]
    if len(rest) != 1:
        return NOT_FORM
    requirement = rest[0]
    m = _PINNED.fullmatch(requirement) or _DIRECT.fullmatch(requirement)
    if m is None:
        return NOT_FORM
    name = canonicalize_name(m.group(1))
    return Install(name, requirement, line, tuple(options), variables)


def pip_install(line: str) -> Install | None:
    """The install a managed-block line makes, if the whole line is one %gpu_install
    writes (see the module doc); None for any other line. Its options are not
    checked against the admin's indexes here: :func:`why_refused` does."""
    parsed = parse_pip(line)
    return parsed if isinstance(parsed, Install) else None


def why_refused(install: Install, allowed=()) -> str:
    """'' when ``install``'s options are all allowed (``allowed``: the admin's index
    URLs, GpulabSaveCopy.package_indexes); else why not, in words."""
    for option, value in install.pairs():
        if option in SOURCE_OPTIONS and not index_allowed(value, allowed):
            return (
                f"it installs from {value} ({option}), which is not a package index "
                "this hub's administrator allows"
            )
        if option == TRUSTED_HOST and not host_allowed(value, allowed):
            return (
                f"it turns off certificate checks for {value} ({option}), which is not a "
                "host this hub's administrator allows"
            )
        if option == "--no-binary" and canonicalize_name(value) != install.name:
            return f"its --no-binary names another package ({value})"
    return ""


def apt_packages(line: str) -> list[str] | None:
    """The Debian packages of a managed apt line, if the whole line is the magic's."""
    m = _APT.fullmatch(line)
    if m is None:
        return None
    names = m.group(1).split(" ")
    if not all(managed_block.APT_PACKAGE.fullmatch(n) for n in names):
        return None
    return names


def managed_installs(text: str, allowed=()) -> Found:
    """What the managed block of a Dockerfile's text installs, line by line: the lines
    offered, and those refused with the reason (``allowed``: see :func:`why_refused`)."""
    found = Found()
    block = managed_block.block_lines(text)
    if block is None:
        return found
    for n, line in enumerate(block):
        if not line.strip() or _USER.fullmatch(line):
            continue  # blank, or the USER lines around the apt line (written anew)
        previous = block[n - 1] if n else ""
        if previous.rstrip().endswith("\\"):
            found.refuse(line, "it continues the line above it")
            continue
        apt = apt_packages(line)
        if apt is not None:
            found.apt += [p for p in apt if p not in found.apt]
            continue
        install = parse_pip(line)
        reason = install if isinstance(install, str) else why_refused(install, allowed)
        if reason:
            found.refuse(line, reason)
            continue
        # The same package again: the build ends with this one.
        found.installs = [i for i in found.installs if i.name != install.name]
        found.installs.append(install)
    return found


class NotOffered(Exception):
    """A choice posted to Save a copy that is not one the page offered (in words)."""


def pick(found: Found, lines, apt) -> Found:
    """The installs of ``found`` the person ticked: ``lines`` (whole RUN lines) and
    ``apt`` (Debian package names), as the form posts them. Each must be exactly one
    offered: a refused line, or one not offered (a forged form, or the source changed
    since the page was shown), raises :class:`NotOffered` and nothing is picked."""
    offered = {i.line: i for i in found.installs}
    refused = {r.line: r.reason for r in found.refused}
    chosen: list[Install] = []
    for line in lines:
        if line in offered:
            if offered[line] not in chosen:
                chosen.append(offered[line])
        elif line in refused:
            raise NotOffered(f"{preview(line, 200)} cannot be brought along: {refused[line]}.")
        else:
            raise NotOffered(
                f"{preview(line, 200)} is not one of the lines this page offers (the source "
                "project's packages may have changed since it was shown)."
            )
    for package in apt:
        if package not in found.apt:
            raise NotOffered(f"apt: {preview(package, 100)} is not one this page offers.")
    order = {i.line: n for n, i in enumerate(found.installs)}
    chosen.sort(key=lambda i: order[i.line])
    apt_chosen = [p for p in found.apt if p in set(apt)]
    return Found(installs=chosen, apt=apt_chosen)


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


def read_source(projects_root: str | Path, owner: str, project: str, allowed=()) -> Found:
    """The managed installs of ``owner/project``'s Dockerfile (problem: why none;
    ``allowed``: the admin's package indexes, see :func:`why_refused`)."""
    try:
        text = read_dockerfile(Project(Path(projects_root), owner, project))
    except ProjectError as e:
        return Found(problem=f"gpulab did not read {project}'s Dockerfile ({_words(e)})")
    return managed_installs(text, allowed)


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


def _lock_file(dir_fd: int, uid: int, gid: int) -> int:
    """The destination's ``.gpulab/dockerfile.lock`` (the file %gpu_install locks), open;
    made for the project's user when missing; never a link, FIFO or device file, and
    never through a link."""
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
            fd = _create(folder, LOCK_NAME, 0o644, uid, gid)
        except FileExistsError:
            st = os.stat(LOCK_NAME, dir_fd=folder, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):  # never open a link, FIFO or device file
                raise ProjectError("its .gpulab/dockerfile.lock is not a regular file") from None
            flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            try:
                fd = os.open(LOCK_NAME, flags, dir_fd=folder)
            except OSError as e:
                raise ProjectError("its .gpulab/dockerfile.lock is not a regular file") from e
    finally:
        os.close(folder)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ProjectError("its .gpulab/dockerfile.lock is not a regular file")
    return fd


def _replace(dir_fd: int, old: bytes, new: bytes) -> bool:
    """Replace the Dockerfile by ``new`` if it still holds ``old`` (False if it changed):
    the contract's atomic writer, inside the open project folder, with the check made
    once the new file is durable, right before the rename."""
    st = safefs.lstat(DOCKERFILE, dir_fd, DOCKERFILE)

    def unchanged() -> bool:
        try:
            return safefs.read_file(dir_fd, DOCKERFILE, len(old)) == old
        except safefs.Refused:
            return False  # it grew, or became a link: changed

    return write_atomic(
        DOCKERFILE,
        new,
        mode=stat.S_IMODE(st.st_mode) & 0o755,
        owner=(st.st_uid, st.st_gid) if os.geteuid() == 0 else None,  # as safefs.chown_fd
        dir_fd=dir_fd,
        precondition=unchanged,
    )


def write_installs(dir_fd: int, found: Found, user: str) -> None:
    """Record ``found`` in the managed block of the Dockerfile of the open project folder
    ``dir_fd`` (``user``: the image's notebook user, for the USER line after apt-get).
    Blocking; call with the Dockerfile's lock held (:func:`bring_along`)."""
    pip_lines = [(i.name, i.line) for i in found.installs]
    for _ in range(5):
        old = safefs.read_file(dir_fd, DOCKERFILE, MAX_DOCKERFILE_BYTES)
        try:
            text = old.decode()
        except UnicodeDecodeError as e:
            raise ProjectError("its Dockerfile is not UTF-8 text") from e
        try:
            new = managed_block.apply(text, pip_lines, found.apt, user).encode()
        except managed_block.DockerfileError as e:
            raise ProjectError(str(e)) from e
        if new == old or _replace(dir_fd, old, new):
            return
    raise ProjectError("its Dockerfile kept changing")


def _why(e: Exception) -> str:
    if isinstance(e, ProjectError):  # what gpulab refuses
        return _words(e)
    return f"the file system refused it ({e.strerror})"  # an OSError: the disk


async def bring_along(project_fd: int, found: Found, user: str, uid: int, gid: int) -> str:
    """Write the installs under the Dockerfile's lock (the one %gpu_install takes);
    '' when done, else why not (in words, for the page). The file work runs on the
    records pool; waiting for an install that holds the lock holds no thread."""
    try:
        fd = await blocking.run(blocking.RECORDS, _lock_file, project_fd, uid, gid)
    except (ProjectError, OSError) as e:
        return _why(e)
    try:
        try:
            await blocking.fd_lock(fd, "the Dockerfile", LOCK_TIMEOUT)
        except blocking.Busy:
            return (
                f"an install in it held its Dockerfile for {LOCK_TIMEOUT:.0f} s; try again "
                "once it is done"
            )
        try:
            await blocking.run(blocking.RECORDS, write_installs, project_fd, found, user)
        except (ProjectError, OSError) as e:
            return _why(e)
        return ""
    finally:
        os.close(fd)  # and with it the lock
