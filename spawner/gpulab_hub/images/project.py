"""A project's image: its build context, content tag, one build at a time, and
the last image that built (kept so a broken Dockerfile never locks a user out).

The context is read from the project folder as hostile input (safefs.py): only
what the Dockerfile's COPY/ADD lines name, one path component at a time, never
through a link; a link, FIFO, socket or device file that a COPY source names or
that lies inside a copied folder is refused with an error naming it (a silently
missing file would make a confusing build). The context is bounded and written
once into a tar spooled to a temporary file, hashed as it is written, so the
tag is the hash of exactly what Docker gets. The last-good record and build
logs live in the hub-owned ``project.state_dir``, never in the project folder.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import io
import json
import logging
import os
import posixpath
import re
import stat
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dockerfile_parse import DockerfileParser

from gpulab_contract.text import CONTROL, strip_ansi
from gpulab_hub import blocking, images, jsonfile, stateversion
from gpulab_hub.images import confine, policy
from gpulab_hub.projects import DOCKERFILE, Project, ProjectError, safefs
from gpulab_hub.projects.traits import PROJECT_REPO

# Never part of a build context, at any depth: gpulab's and Jupyter's bookkeeping.
EXCLUDED = (".gpulab", ".ipynb_checkpoints")
MAX_DOCKERFILE_BYTES = 1 << 20
MAX_CONTEXT_BYTES = 1 << 30  # all files a Dockerfile copies, together
MAX_CONTEXT_FILES = 100_000  # files and folders visited for one context
SPOOL_BYTES = 32 << 20  # a context larger than this goes to a temporary file
_GLOB = set("*?[")
log = logging.getLogger(__name__)
IMAGE_STATE = stateversion.KINDS["project-image"]  # image.json's format (stateversion.py)


def _copy_sources(instruction: dict) -> list[str]:
    """Source paths of a COPY/ADD instruction (none for --from= copies and URLs)."""
    value = instruction["value"].strip()
    words: list[str]
    if value.startswith("["):
        try:
            words = json.loads(value)
        except ValueError as e:
            raise ProjectError(
                f"Line {instruction['startline'] + 1} of the Dockerfile is not a valid JSON list."
            ) from e
        if not all(isinstance(w, str) for w in words):
            raise ProjectError(f"Line {instruction['startline'] + 1} of the Dockerfile: not text.")
    else:
        words = value.split()
    flags = [w for w in words if w.startswith("--")]
    if any(f.startswith("--from") for f in flags):
        return []
    args = [w for w in words if not w.startswith("--")]
    return [a for a in args[:-1] if "://" not in a]


def read_dockerfile(project: Project, dir_fd: int | None = None) -> str:
    """The project's Dockerfile: a regular file (no link), at most 1 MiB of UTF-8 text."""
    fd = safefs.open_project(project) if dir_fd is None else dir_fd
    try:
        data = safefs.read_file(fd, DOCKERFILE, MAX_DOCKERFILE_BYTES)
    finally:
        if dir_fd is None:
            os.close(fd)
    try:
        return data.decode()
    except UnicodeDecodeError as e:
        raise ProjectError("The project's Dockerfile is not UTF-8 text.") from e


def source_parts(src: str, line: int) -> list[str]:
    """A COPY source as path components inside the project ([] is the project itself)."""
    rel = posixpath.normpath(src.lstrip("/") or ".")
    if rel == ".." or rel.startswith("../"):
        raise ProjectError(
            f"Line {line} of the Dockerfile copies {src!r}, which is outside the project "
            "folder; only files of the project can be copied."
        )
    return [] if rel == "." else rel.split("/")


def matches(dir_fd: int, parts: list[str], rel: str, budget: safefs.Budget):
    """The entries a COPY source (``parts``, glob patterns per component) names.

    Yields ``(rel path, kind, parent descriptor, name)``, as safefs.walk does;
    the descriptor is valid until the next step. Links are refused wherever a
    component names or passes through one; excluded names never match.
    """
    if not parts:
        yield rel or ".", "folder", dir_fd, "."
        return
    head, rest = parts[0], parts[1:]
    if _GLOB & set(head):
        names = [
            (n, k)
            for n, k in safefs.entries(dir_fd, budget, rel)
            if fnmatch.fnmatchcase(n, head) and n not in EXCLUDED
        ]
    elif head in EXCLUDED:
        return
    else:
        try:
            st = os.stat(head, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return  # not there: Docker says which source is missing
        budget.take(safefs.join(rel, head))
        names = [(head, _kind(st.st_mode))]
    for name, what in names:
        path = safefs.join(rel, name)
        if what == "link":
            raise safefs.refuse(path, stat.S_IFLNK)
        if not rest:
            yield path, what, dir_fd, name
        elif what == "folder":
            sub = safefs.open_dir(name, dir_fd, path)
            try:
                yield from matches(sub, rest, path, budget)
            finally:
                os.close(sub)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISDIR(mode):
        return "folder"
    return "file" if stat.S_ISREG(mode) else "special"


class _Reader:
    """Exactly ``size`` bytes of an open file, hashed as tarfile reads them."""

    def __init__(self, fd: int, size: int, rel: str, digest):
        self.fd, self.left, self.rel, self.digest = fd, size, rel, digest

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = os.read(self.fd, n) if n else b""
        if len(data) < n:
            raise ProjectError(f"The project's {self.rel} changed while gpulab read it; try again.")
        self.left -= len(data)
        self.digest.update(data)
        return data


class Context:
    """A build context: a tar of the Dockerfile and the copied files, and their digests."""

    def __init__(self, dockerfile: str):
        self.dockerfile = dockerfile
        self.digests: dict[str, bytes] = {}
        self.size = 0
        self._file = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)
        self._tar = tarfile.open(fileobj=self._file, mode="w")
        self.add_bytes(DOCKERFILE, dockerfile.encode())

    @property
    def names(self) -> list[str]:
        return sorted(self.digests)

    def _info(self, name: str, size: int) -> tarfile.TarInfo:
        if size > MAX_CONTEXT_BYTES - self.size:
            raise safefs.Refused(
                f"The files the Dockerfile copies are over {safefs.size_text(MAX_CONTEXT_BYTES)} "
                f"together (at {name}); copy less, or download large files in the build.",
                safefs.TOO_BIG,
                name,
            )
        self.size += size
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = size, 0, 0o644
        return info

    def add_bytes(self, name: str, data: bytes) -> None:
        self._tar.addfile(self._info(name, len(data)), io.BytesIO(data))
        self.digests[name] = hashlib.sha256(name.encode() + b"\0" + data).digest()

    def add_file(self, parent_fd: int, name: str, rel: str) -> None:
        """The regular file ``name`` of ``parent_fd``, read once, into the tar."""
        if rel in self.digests:
            return
        fd, st = safefs.open_file(name, parent_fd, rel)
        try:
            digest = hashlib.sha256(rel.encode() + b"\0")
            self._tar.addfile(self._info(rel, st.st_size), _Reader(fd, st.st_size, rel, digest))
        finally:
            os.close(fd)
        self.digests[rel] = digest.digest()

    def tarball(self):
        """The finished tar, from its start (a file object)."""
        self._tar.close()
        self._file.seek(0)
        return self._file

    def close(self) -> None:
        self._tar.close()
        self._file.close()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def build_context(project: Project, dockerfile_text: str | None = None) -> Context:
    """The Dockerfile plus exactly the project files its COPY/ADD lines use.

    Notebooks the Dockerfile does not copy are not part of the context, so
    editing them never triggers a rebuild. Raises ProjectError for a source
    outside the project folder, a link, a special file, or a context too large.
    """
    root = safefs.open_project(project)
    try:
        text = read_dockerfile(project, root) if dockerfile_text is None else dockerfile_text
        ctx = Context(text)
        try:
            _fill(ctx, root, text)
        except BaseException:
            ctx.close()
            raise
        return ctx
    finally:
        os.close(root)


def _fill(ctx: Context, root: int, text: str) -> None:
    budget = safefs.Budget(MAX_CONTEXT_FILES, "What the Dockerfile copies")
    parser = DockerfileParser(fileobj=io.BytesIO(text.encode()))
    for ins in parser.structure:
        if ins["instruction"] not in ("COPY", "ADD"):
            continue
        for src in _copy_sources(ins):
            parts = source_parts(src, ins["startline"] + 1)
            for rel, what, parent, name in matches(root, parts, "", budget):
                if what == "file":
                    ctx.add_file(parent, name, rel)
                elif what == "folder":
                    _add_folder(ctx, parent, name, rel, budget)
                else:
                    raise safefs.refuse(rel, safefs.lstat(name, parent, rel).st_mode)


def _add_folder(ctx: Context, parent: int, name: str, rel: str, budget: safefs.Budget) -> None:
    fd = safefs.open_dir(name, parent, rel) if name != "." else os.dup(parent)
    try:
        for path, what, dir_fd, entry in safefs.walk(
            fd, "" if rel == "." else rel, budget, skip=EXCLUDED.__contains__
        ):
            if what == "file":
                ctx.add_file(dir_fd, entry, path)
            elif what != "folder":
                raise safefs.refuse(path, safefs.lstat(entry, dir_fd, path).st_mode)
    finally:
        os.close(fd)


def project_tag(docker_call, ctx: Context, repo: str = PROJECT_REPO) -> str:
    """Content tag: every file of the context plus the ID of the base image.

    The same hash as ``images.content_tag(repo, base, *(name + NUL + content))``
    over the files sorted by name, from the digests taken while reading them.
    """
    base = images.base_of(ctx.dockerfile)
    base_id = images.image_id(docker_call, base) if base else None
    h = hashlib.sha256(hashlib.sha256((base_id or base).encode()).digest())
    for name in ctx.names:
        h.update(ctx.digests[name])
    return f"{repo}:{h.hexdigest()[:16]}"


@dataclass(frozen=True)
class LastGood:
    tag: str
    built_at: float

    def describe(self) -> str:
        return f"{self.tag}, built {time.strftime('%Y-%m-%d %H:%M', time.localtime(self.built_at))}"


def state_dir(project: Project) -> Path:
    """The project's hub-owned state folder (root, 0700), made if missing."""
    path = project.state_dir
    for folder in (Path(project.state_root), path.parent, path):
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def logs_dir(project: Project) -> Path:
    """The project's build logs folder in its state folder (root, 0700), made if missing."""
    state_dir(project)
    project.logs_dir.mkdir(mode=0o700, exist_ok=True)
    return project.logs_dir


def _state_file(project: Project) -> Path:
    return project.state_dir / "image.json"


def read_state(project: Project, *, strict: bool = False) -> dict:
    """The hub's record of the project's image; {} when there is none or it is corrupt
    or of a newer gpulab (``strict``: stateversion.NewerState for that one, which is
    never written over)."""
    path = _state_file(project)
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.warning("gpulab: ignoring the unreadable image record %s: %s", path, e)
        return {}
    if not isinstance(state, dict):
        log.warning("gpulab: ignoring the image record %s: not a JSON object", path)
        return {}
    try:
        return IMAGE_STATE.upgrade(state, path)
    except stateversion.NewerState as e:
        if strict:
            raise
        log.error("gpulab: ignoring the image record: %s", e)
    except ValueError as e:
        log.warning("gpulab: ignoring the image record %s: %s", path, e)
    return {}


def last_good(project: Project, docker_call=None, repo: str = PROJECT_REPO) -> LastGood | None:
    """The last image that built for this project: a tag of ``repo`` (that still exists,
    when ``docker_call`` is given)."""
    state = read_state(project).get("last_good")
    if state is None:
        return None
    try:
        good = LastGood(state["tag"], float(state["built_at"]))
    except (TypeError, KeyError, ValueError, OverflowError):
        good = None
    if good is None or not isinstance(good.tag, str) or not 0 <= good.built_at < 1e11:
        log.warning("gpulab: ignoring a malformed last good image in %s", _state_file(project))
        return None
    if not re.fullmatch(re.escape(repo) + r":[0-9a-f]{16}", good.tag):
        log.warning("gpulab: ignoring the last good image %r: not a tag of %s", good.tag, repo)
        return None
    if docker_call is not None and not images.image_id(docker_call, good.tag):
        return None
    return good


def last_build_failed(project: Project) -> bool:
    return read_state(project).get("failed") is True


def changed_since_failure(
    docker_call, project: Project, repo: str = PROJECT_REPO, *, allowed: tuple[str, ...]
) -> bool:
    """Whether the project's build content (its Dockerfile, the files it copies, its
    base) is no longer what failed to build: someone fixed it, from inside the last
    image that built or elsewhere. False when unknown (a failure recorded before gpulab
    kept its content, a Dockerfile refused now, Docker unreachable)."""
    import docker.errors

    failed = read_state(project).get("failed_tag")
    if not isinstance(failed, str):
        return False
    try:
        ctx = checked_context(docker_call, project, allowed)
    except ProjectError:
        return False  # refused as it is: building again would fail the same way
    except docker.errors.DockerException as e:
        log.warning("gpulab: could not compare %s with its failed build: %s", project.name, e)
        return False
    try:
        return project_tag(docker_call, ctx, repo) != failed
    except docker.errors.DockerException as e:
        log.warning("gpulab: could not compare %s with its failed build: %s", project.name, e)
        return False
    finally:
        ctx.close()


def failed_at(project: Project) -> float | None:
    """When the project's last build failed (seconds since the epoch), if it did."""
    state = read_state(project)
    when = state.get("failed_at")
    if state.get("failed") is not True or not isinstance(when, (int, float)):
        return None
    return float(when) if 0 <= when < 1e11 else None


def last_good_note(project: Project, good: LastGood, verb: str = "Running") -> str:
    """One line for the user: this start runs the last image that built, and why."""
    note = f"{verb} the last image that built ({good.describe()}), not the current Dockerfile"
    failed = failed_at(project)
    if failed is None:
        return note + "."
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(failed))
    return f"{note}: the Dockerfile's build of {when} failed."


def record(project: Project, tag: str | None, failed: bool, failed_tag: str = "") -> None:
    """The outcome of a build: ``tag``, the image that built (None: none did);
    ``failed_tag``, the content tag of the build that failed (changed_since_failure)."""
    state = read_state(project, strict=True)
    state["failed"] = failed
    if failed:
        state["failed_at"] = time.time()
        state["failed_tag"] = failed_tag
    else:
        state.pop("failed_at", None)
        state.pop("failed_tag", None)
    if tag:
        state["last_good"] = {"tag": tag, "built_at": time.time()}
    jsonfile.write_atomic(state_dir(project) / "image.json", IMAGE_STATE.stamp(state))


# --- build logs, as their owner reads them -------------------------------------------
LOG_NAME = re.compile(r"build-\d{8}-\d{6}\.log")
MAX_LOG_SHOWN = 256 << 10  # the end of a longer log is shown


def plain_text(text: str) -> str:
    """Build output as plain text: no ANSI escape codes or other control characters
    (a carriage return, as in progress bars, ends a line)."""
    text = strip_ansi(text).replace("\r\n", "\n").replace("\r", "\n")
    return CONTROL.sub("", text)


def latest_log(project: Project) -> Path | None:
    """The project's newest build log in its state folder (None when it has none)."""
    try:
        names = [e.name for e in os.scandir(project.logs_dir) if LOG_NAME.fullmatch(e.name)]
    except (FileNotFoundError, NotADirectoryError):
        return None
    return project.logs_dir / max(names) if names else None


def read_log(path: Path, limit: int = MAX_LOG_SHOWN) -> tuple[str, bool]:
    """The last ``limit`` bytes of a build log as plain text, and whether it was cut.

    Never through a link, only a regular file (the hub wrote it; a bounded read anyway).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ProjectError("The build log is not a regular file.")
        cut = st.st_size > limit
        want = limit + 1 if cut else limit  # with the byte before: is the cut on a line end?
        if cut:
            os.lseek(fd, st.st_size - want, os.SEEK_SET)
        data = b""
        while len(data) < want and (chunk := os.read(fd, want - len(data))):
            data += chunk
    finally:
        os.close(fd)
    if cut:
        data = data.partition(b"\n")[2]  # from the first whole line
    return plain_text(data.decode(errors="replace")), cut


@dataclass
class Plan:
    """What a start needs of the project's image: ``tag``, and the build ``context``
    when no image of that tag exists yet (None: nothing to build)."""

    tag: str
    context: Context | None = None

    def close(self) -> None:
        if self.context is not None:
            self.context.close()


def checked_context(docker_call, project: Project, allowed: tuple[str, ...]) -> Context:
    """The context of what gpulab builds: the project's Dockerfile checked (policy.py:
    only the admin's bases and its own stages, ADD of project files), each allowed base
    pinned to the image ID it has now."""
    resolve = functools.partial(images.image_id, docker_call)
    return build_context(project, policy.check(read_dockerfile(project), allowed, resolve))


def plan_image(
    docker_call, project: Project, repo: str = PROJECT_REPO, *, allowed: tuple[str, ...]
) -> Plan:
    """The project's image tag, with the build context when it must be built (quick:
    reads the project's files and asks Docker whether the tag exists)."""
    ctx = checked_context(docker_call, project, allowed)
    try:
        tag = project_tag(docker_call, ctx, repo)
        if images.image_id(docker_call, tag):
            ctx.close()
            return Plan(tag)
    except BaseException:
        ctx.close()
        raise
    return Plan(tag, ctx)


def build_planned(
    docker_call,
    project: Project,
    plan: Plan,
    lock_dir: Path,
    on_line,
    limits: confine.BuildLimits,
    repo: str = PROJECT_REPO,
    labels: dict[str, str] | None = None,
    *,
    network: str,
) -> str:
    """Build a planned image (on a build thread). One build per content tag at a time,
    across threads and processes: a second caller waits for the first and then reuses
    its image. Records the result (last good image, or that the build failed)."""
    tag = plan.tag
    lock_dir.mkdir(parents=True, exist_ok=True)
    name = tag.replace("/", "_").replace(":", "_") + ".lock"
    # the other build of this content may take its whole time limit
    wait_s = limits.timeout + 60
    with blocking.file_lock(lock_dir / name, "the image this project needs", timeout=wait_s):
        if plan.context is None or images.image_id(docker_call, tag):
            on_line(f"Using the image {tag} (the Dockerfile is unchanged)")
        else:
            folder = logs_dir(project)
            confine.rotate_logs(folder, LOG_NAME, max(0, limits.logs_kept - 1))
            log_path = folder / f"build-{time.strftime('%Y%m%d-%H%M%S')}.log"
            try:
                images.build(
                    docker_call,
                    plan.context.tarball(),
                    tag,
                    log_path,
                    on_line,
                    labels=labels,
                    network=network,
                    limits=limits,
                )
            except images.QuickBuildOver:
                raise  # not the Dockerfile's failure: the build goes on in a slot
            except images.BuildError:
                record(project, None, failed=True, failed_tag=tag)
                raise
    record(project, tag, failed=False)
    return tag


def ensure_image(
    docker_call,
    project: Project,
    lock_dir: Path,
    on_line,
    timeout: float,
    repo: str = PROJECT_REPO,
    labels: dict[str, str] | None = None,
    *,
    network: str,
    memory: int | None = None,
    limits: confine.BuildLimits | None = None,
    allowed: tuple[str, ...],
) -> str:
    """The tag of the project's image, built only if its content is new (plan_image,
    then build_planned on this thread). The build runs within ``limits`` (by default
    ``timeout`` and ``memory`` per step) on a network of its own (images.build)."""
    limits = limits or confine.BuildLimits(timeout=timeout, memory=memory)
    plan = plan_image(docker_call, project, repo, allowed=allowed)
    try:
        return build_planned(
            docker_call, project, plan, lock_dir, on_line, limits, repo, labels, network=network
        )
    finally:
        plan.close()
