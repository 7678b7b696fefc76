"""The starting points' images, built in the background after the hub starts.

A new project's first start builds its Dockerfile; a starting point's lines (a pip
install of a few packages) take minutes there. After the hub starts it builds, for each
starting point in ``ProjectSpawner.prebuild_stacks``, the very Dockerfile a new project
of that starting point gets (the spawner renders it: ``new_project_dockerfile``), so
Docker's layer cache (parent image + instruction text) holds those layers and a user's
first project reuses them like a cached start.

Lowest priority, one at a time, never in a user's way:

- one build at a time, on a thread of its own (never a slot of the users' build pool);
- each step runs with the least CPU weight (``cpu_shares`` 2 against Docker's 1024), so
  any other work, a user's build first, gets the CPUs before it;
- the next starting point starts only while no user's build runs or waits (builds.busy);
- a start whose Dockerfile holds the lines of the starting point being built now waits
  for that build (the same work) and says where it is on its spawn page, then reuses it.

Re-runnable and idempotent: the image is tagged by content (the project tag), so a
starting point whose image exists costs one look, and a rebuilt one reuses every layer
that did not change. The state of each (waiting, building step N of M, ready, failed
with the last log lines) is what the admin page shows (:func:`states`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import docker.errors
import requests.exceptions

from gpulab_hub import images
from gpulab_hub.images import builds, policy
from gpulab_hub.images import project as projectimage
from gpulab_hub.projects import ProjectError, stacks

LOG = logging.getLogger("gpulab_hub")

CPU_SHARES = 2  # the least CPU weight Docker gives a container (its default is 1024)
POLL_S = 2.0  # how often a waiting build looks again (users' builds, the build awaited)
START_DELAY_S = 5.0  # after the hub's first database commit, before the first build
LABEL = "gpulab.starting-point"
LOG_FOLDER = "starting-points"  # in the hub's records folder: one build log each
_STEP = re.compile(r"^Step (\d+)/(\d+)")


@dataclass
class Point:
    """One starting point's background build, as the admin page and spawn pages say it."""

    name: str
    label: str
    state: str = "waiting"  # waiting, building, ready, failed
    why: str = "the hub is starting"  # what a waiting build waits for
    step: int = 0
    total: int = 0
    line: str = ""  # the build's latest line (bounded)
    tail: tuple[str, ...] = ()  # a failed build's last log lines
    error: str = ""
    tag: str = ""
    lines: str = ""  # the starting point's Dockerfile lines (how a start recognises it)
    changed: float = field(default_factory=time.time)

    @property
    def words(self) -> str:
        if self.state == "ready":
            return "Ready: a new project from it starts from cached layers."
        if self.state == "building":
            where = f"step {self.step} of {self.total}" if self.total else "starting"
            return f"Building: {where}" + (f" ({self.line})" if self.line else "") + "."
        if self.state == "failed":
            return f"Failed: {self.error} New projects from it build it on their first start."
        return f"Waiting: {self.why}."

    def copy(self) -> Point:
        return dataclasses.replace(self)


class Prebuild:
    """The background builds of one hub (its spawner's settings: ``spawner``)."""

    def __init__(self, spawner):
        self.spawner = spawner
        self.points = {
            n: Point(n, stacks.get(n).label) for n in dict.fromkeys(spawner.prebuild_stacks)
        }
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="gpulab-prebuild")
        self.done = asyncio.Event()

    async def run(self) -> None:
        """Every starting point in turn, each once no user's build runs or waits."""
        loop = asyncio.get_running_loop()
        try:
            await asyncio.sleep(START_DELAY_S)  # the hub is still starting
            for point in self.points.values():
                self._set(point, why="in line, after the starting points above")
            for point in self.points.values():
                while builds.busy():
                    self._set(point, why="a user's image build runs first")
                    await asyncio.sleep(POLL_S)
                self._set(point, state="building", why="")
                await loop.run_in_executor(self.executor, self._build, point)
        finally:
            self.done.set()
            self.executor.shutdown(wait=False)

    def _set(self, point: Point, **changes) -> None:
        for key, value in changes.items():
            setattr(point, key, value)
        point.changed = time.time()

    def _build(self, point: Point) -> None:
        """Blocking (the prebuild thread): build the starting point's image if it is new."""
        sp = self.spawner
        name = f"{point.label} starting point"
        try:
            text = sp.new_project_dockerfile(point.name, name)
            point.lines = stacks.lines(point.name, sp.torch_index())
            pinned = policy.check(
                text, tuple(sp.allowed_base_images), functools.partial(images.image_id, sp._docker)
            )
            with projectimage.Context(pinned) as ctx:
                tag = projectimage.project_tag(sp._docker, ctx, sp.image_repo)
                if not images.image_id(sp._docker, tag):
                    log_path = Path(sp.records_dir) / LOG_FOLDER / f"{point.name}.log"
                    limits = dataclasses.replace(sp.build_limits(), cpu_shares=CPU_SHARES)
                    images.build(
                        sp._docker,
                        ctx.tarball(),
                        tag,
                        log_path,
                        functools.partial(self._on_line, point),
                        labels={LABEL: point.name},
                        network=sp.network_name,
                        limits=limits,
                    )
            self._set(point, state="ready", tag=tag, line="")
            LOG.info("gpulab: the %s starting point is ready (%s)", point.label, tag)
        except images.BuildError as e:
            self._set(point, state="failed", error=e.message, tail=tuple(e.tail))
            LOG.warning("gpulab: the %s starting point did not build: %s", point.label, e)
        except (ProjectError, docker.errors.DockerException, requests.exceptions.RequestException,
                OSError) as e:  # fmt: skip
            self._set(point, state="failed", error=str(e)[:300], tail=())
            LOG.warning("gpulab: the %s starting point did not build: %s", point.label, e)

    def _on_line(self, point: Point, line: str) -> None:
        m = _STEP.match(line)
        if m:
            point.step, point.total = int(m.group(1)), int(m.group(2))
        if line.strip():
            point.line = line.strip()[:160]
        point.changed = time.time()

    async def wait_for(self, dockerfile: str, emit: Callable[[int, str], None]) -> None:
        """Until the starting point being built now is done, where ``dockerfile`` (a
        start's, about to be built) holds its lines; its spawn page says where it is."""
        building = [
            p for p in self.points.values() if p.state == "building" and p.lines
        ]  # fmt: skip
        point = next((p for p in building if p.lines in dockerfile), None)
        if point is None:
            return
        said = ""
        while point.state == "building":
            words = (
                f"Waiting for the {point.label} starting point, which this hub is preparing"
                f" for every new project: {point.words[len('Building: ') :]}"
                " This start then reuses it."
            )
            if words != said:
                emit(9, words[:300])
                said = words
            await asyncio.sleep(POLL_S / 4)


_hub: Prebuild | None = None
_tasks: set[asyncio.Task] = set()
_scheduled = False  # the hub's start of the builds is on its loop (_on_commit)


def states() -> list[Point]:
    """Each starting point's background build now (copies), in the hub that runs them;
    [] where none was asked for (``prebuild_stacks`` empty) or the hub runs none."""
    return [p.copy() for p in _hub.points.values()] if _hub else []


async def wait_for(dockerfile: str, emit: Callable[[int, str], None]) -> None:
    """Prebuild.wait_for of the hub's background builds (nothing where none run)."""
    if _hub is not None:
        await _hub.wait_for(dockerfile, emit)


def start(spawner) -> Prebuild | None:
    """Start the background builds of ``spawner``'s settings on the running loop (once)."""
    global _hub
    if _hub is not None or not getattr(spawner, "prebuild_stacks", None):
        return _hub
    _hub = Prebuild(spawner)
    task = asyncio.get_running_loop().create_task(_hub.run())
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    return _hub


def install() -> None:
    """In the hub's process (hubconfig.apply): after its first database commit on its
    event loop (the configuration is loaded by then), start the background builds."""
    from sqlalchemy import event
    from sqlalchemy.orm import Session

    if not event.contains(Session, "after_commit", _on_commit):
        event.listen(Session, "after_commit", _on_commit)


def _on_commit(_session) -> None:
    global _scheduled
    if _scheduled:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    _scheduled = True
    loop.call_soon(_start_in_hub)


def _start_in_hub() -> None:
    from jupyterhub.app import JupyterHub

    from gpulab_hub import hubsettings

    if not JupyterHub.initialized():
        return
    app = JupyterHub.instance()
    try:
        start(hubsettings.spawner_of(app.config, app.spawner_class))
    except (ValueError, TypeError, OSError) as e:  # a spawner without gpulab's traits
        LOG.warning("gpulab: the starting points are not built in the background: %s", e)
