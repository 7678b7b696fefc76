"""Image templates and builds by content hash.

Templates live in the repository's ``images/`` folder (``*.j2``, Jinja2). A
project's image is tagged with a hash of its Dockerfile and of the image it
starts FROM, so an unchanged project never rebuilds.

Every function that talks to Docker takes ``docker_call``: one callable
``docker_call(method, *args, **kwargs)`` that invokes a ``docker.APIClient``
method. The spawner passes its own (which runs on its thread pool), the CLI a
plain one; nothing here opens a client of its own.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections import deque
from collections.abc import Callable
from pathlib import Path

import jinja2
import requests.exceptions
import urllib3.exceptions
from dockerfile_parse import DockerfileParser

from gpulab_contract import managed_block
from gpulab_hub.images import confine
from gpulab_hub.projects import objects

LOG_TAIL = 20


class BuildError(Exception):
    """A build failed; ``str()`` is the message for the user, ``tail`` the last log lines."""

    def __init__(
        self, message: str, tail: list[str], log_path: Path | None = None, limit: bool = False
    ):
        self.tail = tail
        self.message = message
        self.limit = limit  # stopped by a build limit (time, disk), not by a step's own failure
        self.log_path = log_path
        text = message
        if tail:
            text += "\nLast lines of the build log:\n" + "\n".join(tail)
        if log_path:
            text += f"\nFull log: {log_path}"
        super().__init__(text)


class QuickBuildOver(BuildError):
    """A build in the quick lane (builds.py) ran past ``BuildLimits.quick_s`` and was
    stopped: not a failure of the project's Dockerfile; it waits for a slot and goes on."""


def render(images_dir: str | Path, template: str, **params) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(images_dir)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    # the managed block's markers, from the contract the magic and Save a copy parse with
    env.globals.update(
        managed_block_start=managed_block.START_MARKER,
        managed_block_end=managed_block.END_MARKER,
    )
    return env.get_template(template).render(**params)


def base_of(dockerfile_text: str) -> str:
    """The image the (last stage of the) Dockerfile starts FROM."""
    parser = DockerfileParser(fileobj=io.BytesIO(dockerfile_text.encode()))
    return parser.baseimage or ""


def content_tag(repo: str, *parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return f"{repo}:{h.hexdigest()[:16]}"


def image_id(docker_call, ref: str) -> str | None:
    """The local image ID for ``ref``, or None when it is not present."""
    import docker.errors

    try:
        return docker_call("inspect_image", ref)["Id"]
    except docker.errors.ImageNotFound:
        return None


def tar_context(files: dict[str, bytes]) -> io.BytesIO:
    """An in-memory build context from ``{path in context: content}``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def _line(chunk: dict) -> str:
    if "stream" in chunk:
        return chunk["stream"].rstrip("\n")
    if "status" in chunk:
        return " ".join(str(chunk[k]) for k in ("id", "status", "progress") if chunk.get(k))
    if "aux" in chunk:
        return ""
    return str(chunk)


def _read(stream, tag, timeout, tail, log_path):
    try:
        yield from stream
    except (requests.exceptions.Timeout, urllib3.exceptions.TimeoutError) as e:
        raise BuildError(
            f"The image build for {tag} printed nothing for {timeout:.0f} s and was stopped.",
            list(tail),
            log_path,
        ) from e


def build(
    docker_call,
    context: io.BytesIO,
    tag: str,
    log_path: Path,
    on_line: Callable[[str], None] = lambda line: None,
    timeout: float = 3600,
    labels: dict[str, str] | None = None,
    *,
    network: str,
    memory: int | None = None,
    limits: confine.BuildLimits | None = None,
    runtime: str = "gpulab",
    require_confined: bool = True,
) -> str:
    """Build ``context`` into ``tag``; stream lines to ``on_line`` and ``log_path``.

    Blocking: run it on a build thread. The build's RUN steps join a network of
    their own (named after ``network``, gpulab's bridge, made and removed here) and
    are confined as confine.py says, within ``limits`` (by default ``timeout`` and
    ``memory`` per step). With ``require_confined`` an engine that does not create
    containers through gpulab's ``runtime`` is refused. Raises BuildError with the
    last lines of the log when Docker reports an error or a limit stopped the build.
    Returns the tag.
    """
    limits = limits or confine.BuildLimits(timeout=timeout, memory=memory)
    objects.check_network(network)
    info = docker_call("info")
    if require_confined:
        try:
            confine.check_engine(info, runtime)
        except confine.BuildRefused as e:
            raise BuildError(str(e), [], limit=True) from e
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tail: deque[str] = deque(maxlen=LOG_TAIL)
    log = confine.CappedLog(log_path, limits.log_bytes)
    try:
        with confine.BuildNetwork(docker_call, network) as net:
            watch = confine.StepWatch(
                docker_call, net.name, limits, root_dir=info.get("DockerRootDir")
            )
            watch.start()
            try:
                _stream(docker_call, context, tag, labels, limits, info, net, watch, log, tail,
                        on_line)  # fmt: skip
            finally:
                watch.stop()
                watch.kill_steps()  # a build left early (an error, a timeout): no step runs on
    finally:
        log.close()
    return tag


def _stream(docker_call, context, tag, labels, limits, info, net, watch, log, tail, on_line):
    stream = docker_call(
        "build",
        fileobj=context,
        custom_context=True,
        tag=tag,
        rm=True,
        forcerm=True,
        decode=True,
        network_mode=net.name,
        container_limits=limits.container_limits() or None,
        engine_params=limits.engine_params(info.get("CgroupDriver", "")),
        labels=labels or {},
        # also bounds a step that prints nothing for the whole time
        timeout=max(1, int(limits.timeout) + 5),
    )
    failed = False
    for chunk in _read(stream, tag, limits.timeout, tail, log.path):
        text = _line(chunk)
        if "error" in chunk:
            text = chunk.get("error", "").rstrip("\n")
            failed = True
        for line in text.splitlines():
            log.write(line)
            tail.append(line)
            watch.line(line)
            on_line(line)
        if failed:
            break
    if watch.stopped == "quick":
        raise QuickBuildOver(
            f"The image build for {tag} ran past {limits.quick_s:.0f} s beside your other "
            "build and was stopped; it goes on once that build ended.",
            list(tail),
            log.path,
            limit=True,
        )
    if watch.stopped == "time":
        raise BuildError(
            f"The image build for {tag} took longer than {limits.timeout:.0f} s and was stopped.",
            list(tail),
            log.path,
            limit=True,
        )
    if watch.stopped == "disk":
        raise BuildError(
            f"The image build for {tag} wrote more than {_gib(limits.disk)} to disk and was "
            "stopped. Write large files to /data or your project folder from the running "
            "project, not in the image.",
            list(tail),
            log.path,
            limit=True,
        )
    if failed:
        raise BuildError(f"The image build for {tag} failed.", list(tail), log.path)


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"
