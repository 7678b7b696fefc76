"""What counts as activity besides browsers: a running job, a busy GPU, a cell
running (or queued) on the server's side (cells.py).

Jupyter Server reports its last activity to the hub (``jupyterhub-singleuser``),
and the hub's idle culler stops projects idle for longer than the admin allows.
A training run with no browser open is not idle: every ``every_s`` this marks the
server active (the settings keys ``*_last_activity`` that Jupyter Server adds to
its own) while a job runs, a cell runs or waits in the server's queue, or a GPU of
this container was busy in the last minute.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from traitlets import Float
from traitlets.config import Configurable

from gpulab_jupyter.jobs.local import any_running as jobs_running


class ActivityReporter(Configurable):
    every_s = Float(
        30.0,
        config=True,
        help="""How often (seconds) running jobs and GPU use are checked.
        Example: ``c.ActivityReporter.every_s = 60``""",
    )
    gpu_busy_percent = Float(
        5.0,
        config=True,
        help="""A GPU at or above this utilization (percent) in the last minute keeps
        the project from being culled as idle. Example:
        ``c.ActivityReporter.gpu_busy_percent = 10``""",
    )

    def __init__(self, settings: dict, engine, sampler, **kw):
        super().__init__(**kw)
        self.settings = settings
        self.engine = engine
        self.sampler = sampler
        self._periodic = None

    def gpu_busy(self) -> bool:
        history = self.sampler.history(time.time() - 60.0) if self.sampler else {}
        busy = self.gpu_busy_percent
        for gpu in (history.get("gpus") or {}).values():
            if any(u is not None and u >= busy for u in gpu.get("utilization", ())):
                return True
        return False

    def cells_busy(self) -> bool:
        cells = self.settings.get("gpulab_cells")
        return bool(cells is not None and cells.busy())

    async def check(self) -> dict[str, bool]:
        loop = asyncio.get_running_loop()
        found = {
            "jobs": await loop.run_in_executor(None, jobs_running, self.engine),
            "gpu": self.gpu_busy(),
            "cells": self.cells_busy(),
        }
        now = datetime.now(UTC)
        for source, active in found.items():
            if active:
                self.settings[f"gpulab_{source}_last_activity"] = now
        return found

    async def _tick(self) -> None:
        try:
            await self.check()
        except (OSError, ValueError) as e:
            self.log.warning("gpulab: could not check jobs and GPU use: %s", e)

    def start(self) -> None:
        """Checks every ``every_s`` once the server's event loop runs."""
        from tornado.ioloop import PeriodicCallback

        self._periodic = PeriodicCallback(self._tick, self.every_s * 1000)
        self._periodic.start()

    def stop(self) -> None:
        if self._periodic is not None:
            self._periodic.stop()
