"""ImageSteps: how ProjectSpawner finds or builds the image a start runs.

The project's folder and Dockerfile made on its first start (rendered from its starting
point), its content's image looked up, built on the build pool when it is new (within
this user's share, in the quick lane or not: images/builds.py), or the project's last
good image where the start asks for it; the build's lines as spawn progress. Mixed into
ProjectSpawner (spawner.py) ahead of DockerSpawner, so its ``progress`` is the one the
spawn page reads.

What it needs from the class it is mixed into (ProjectSpawner has them all):

- ``log``, ``user``, ``name``, ``orm_spawner``, ``user_options``, ``hub``,
  ``mem_limit``, ``cpu_limit``, ``network_name`` and ``_log_name`` (JupyterHub's
  Spawner and DockerSpawner); ``_docker`` (DockerSpawner's blocking call);
- the project traits (projects/traits.py): ``projects_root``, ``images_dir``,
  ``project_template``, ``base_image``, ``image_repo``, ``allowed_base_images``,
  ``starting_point_torch``, ``cpu_torch_index`` and the ``build_*`` limits and pool
  sizes (``build_timeout``, ``build_mem_limit``, ``build_cpu_limit``,
  ``build_pids_limit``, ``build_disk_limit``, ``build_log_limit``,
  ``build_logs_kept``, ``build_quick_s``, ``build_threads``, ``build_max_per_user``);
- ``project`` (this start's :class:`Project`), ``notebook_owner()`` (the notebook
  user's host uid and gid), ``_run(fn, *args)`` (``fn`` on the hub's Docker pool)
  and ``_progress_events`` (the list ``start`` begins; the events go there).

It sets ``_image_note`` (which image the start runs, for the project's environment)
and, while a build runs, ``_build_step`` and ``_last_line_at``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import re
import threading
import time
from pathlib import Path

from gpulab_hub import images
from gpulab_hub.gpus import spawner as gpu_spawner
from gpulab_hub.home import buildlog
from gpulab_hub.images import builds, confine, prebuild
from gpulab_hub.images import project as projectimage
from gpulab_hub.projects import Project, ProjectError, options, stacks
from gpulab_hub.projects.safefs import ensure_project
from gpulab_hub.projects.title import title

_STEP = re.compile(r"^Step (\d+)/(\d+)")


class ImageSteps:
    """The image steps of a project's start (module docstring: what they need)."""

    def _emit(self, progress: int, message: str, note: bool = False):
        """A progress event; ``note``: the spawn page keeps it in view (spawn_pending.html)."""
        event = {"progress": progress, "message": message}
        if note:
            event["gpulab_note"] = True
        self._progress_events.append(event)

    def _emit_build_wait(self, progress: int, message: str) -> None:
        """The build pool's word on this start's build (which lane, what it waits for):
        on the spawn page, and in the hub's log for the admin."""
        self._emit(progress, message)
        self.log.info("gpulab: build of %s: %s", self._log_name, message)

    async def progress(self):
        sent = 0
        while True:
            events = getattr(self, "_progress_events", [])
            while sent < len(events):
                yield events[sent]
                sent += 1
            await asyncio.sleep(0.25)

    def _on_build_line(self, line: str):
        """Build output -> spawn progress: every step, other lines twice a second."""
        m = _STEP.match(line)
        now = time.monotonic()
        if m:
            self._build_step = (int(m.group(1)), int(m.group(2)))
        elif now - self._last_line_at < 0.5 or not line.strip():
            return
        self._last_line_at = now
        step, total = self._build_step
        progress = 10 + int(60 * step / max(total, 1))
        if m:
            self._emit(progress, f"Building image: {line}")
        else:
            self._emit(progress, f"Building image: step {step}/{total}: {line.strip()[:200]}")

    def _render_dockerfile(self, project: Project) -> str:
        return self.new_project_dockerfile(
            options.stack_of(self.user_options),
            title(self) if self.orm_spawner else options.one_line(project.name),
        )

    def torch_index(self) -> str:
        """Blocking (the GPU inventory): where the torch starting points' CPU PyTorch
        comes from on this host ("" for none: PyPI's CUDA build; stacks.torch_index)."""
        has_gpu = bool(gpu_spawner.cached_inventory().devices)
        return stacks.torch_index(self.starting_point_torch, has_gpu, self.cpu_torch_index)

    def new_project_dockerfile(self, stack: str, display_name: str) -> str:
        """Blocking: the Dockerfile a new project of the starting point ``stack`` gets
        (the one rendering: a project's first start, the background builds' prebuild.py)."""
        return images.render(
            self.images_dir,
            self.project_template,
            base_image=self.base_image,
            display_name=display_name,
            stack_lines=stacks.lines(stack, self.torch_index()),
        )

    def _plan_image(self, use_last_good: bool) -> projectimage.Plan:
        """Blocking (Docker pool): project folder + Dockerfile, and what its image needs:
        a tag that exists, or a build (Plan.context) that runs on the build pool."""
        project = self.project
        if ensure_project(project, self._render_dockerfile(project), *self.notebook_owner()):
            self._emit(5, f"Created project folder with a Dockerfile from {self.project_template}")
        if use_last_good:
            good = projectimage.last_good(project, self._docker, self.image_repo)
            if good is None:
                raise ProjectError(
                    "This project has no earlier image that built. Start it again to build "
                    "its Dockerfile."
                )
            self._image_note = ("last-good", projectimage.last_good_note(project, good))
            self._emit(70, projectimage.last_good_note(project, good, "Starting"), note=True)
            return projectimage.Plan(good.tag)
        self._emit(8, "Checking the project's image")
        self._image_note = ("latest", "Running the image built from the project's Dockerfile.")
        plan = projectimage.plan_image(
            self._docker, project, self.image_repo, allowed=tuple(self.allowed_base_images)
        )
        if plan.context is None:
            # the image exists (built before, by this project or one with its content):
            # it is this project's last good image, as after a build
            projectimage.record(project, plan.tag, failed=False)
            self._emit(70, f"Using the image {plan.tag} (the Dockerfile is unchanged)")
        return plan

    def build_limits(self) -> confine.BuildLimits:
        """The limits of this hub's builds (the ``build_*`` settings)."""
        return confine.BuildLimits(
            timeout=self.build_timeout,
            memory=self.build_mem_limit or self.mem_limit or None,
            cpus=self.build_cpu_limit or self.cpu_limit or None,
            pids=self.build_pids_limit,
            disk=self.build_disk_limit,
            log_bytes=self.build_log_limit,
            logs_kept=self.build_logs_kept,
        )

    def _build_image(self, plan: projectimage.Plan, quick: threading.Event | None = None) -> str:
        """Blocking (build pool): build the planned image (``quick``: in the quick lane,
        stopped past ``build_quick_s`` or once the event is set: builds.py)."""
        self._build_step, self._last_line_at = (0, 1), 0.0
        limits = self.build_limits()
        if quick is not None:
            limits = dataclasses.replace(limits, quick_s=self.build_quick_s, quick_stop=quick)
        return projectimage.build_planned(
            self._docker,
            self.project,
            plan,
            Path(self.projects_root) / ".locks",
            self._on_build_line,
            limits,
            repo=self.image_repo,
            network=self.network_name,
        )

    async def _prepare_image(self, use_last_good: bool) -> str:
        """The image this start runs: found on the Docker pool, built (when its content
        is new) on the build pool, within this user's share of it (builds.py)."""
        plan = await self._run(self._plan_image, use_last_good)
        try:
            if plan.context is None:
                return plan.tag
            # the starting point being built in the background now, where this is its
            # project's first build: the same work, so this start waits and reuses it
            await prebuild.wait_for(plan.context.dockerfile, self._emit)
            pool = builds.pool(self.build_threads, self.build_max_per_user, self.build_quick_s)
            who = options.one_line(title(self) if self.orm_spawner else self.name)[:60]
            build = functools.partial(self._build_image, plan)
            return await pool.run(self.user.name, who, self._emit_build_wait, build)
        finally:
            plan.close()

    def build_log_url(self) -> str:
        """The hub page of this project's latest build log ('' when it has none)."""
        project = self.project
        if projectimage.latest_log(project) is None:
            return ""
        return buildlog.page_url(self.hub.base_url, self.user.name, project.name)
