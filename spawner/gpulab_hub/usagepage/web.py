"""The handlers of /hub/gpulab/usage and /hub/gpulab/usage.csv, for admins only."""

from __future__ import annotations

import time

from jupyterhub import orm
from jupyterhub.handlers import BaseHandler
from tornado import web

from gpulab_hub import blocking, hubsettings
from gpulab_hub.db import tables
from gpulab_hub.usagepage import report


def _labels() -> dict[str, str]:
    """UUID -> "GPU 1 (NVIDIA H100 80GB HBM3)" of this host's GPUs (blocking, cached)."""
    from gpulab_hub.gpus import allocator
    from gpulab_hub.gpus.spawner import cached_inventory

    return {d.uuid: allocator.label(d) for d in cached_inventory().devices}


class _AdminOnly(BaseHandler):
    def _window(self) -> str:
        window = self.get_query_argument("window", report.DEFAULT_WINDOW, strip=False)
        if window not in report.WINDOWS:
            offered = ", ".join(report.WINDOWS)
            raise web.HTTPError(400, f"Choose a window of {offered}.")
        return window

    def _check_admin(self) -> None:
        if not self.current_user.admin:
            raise web.HTTPError(403, "Only admins may see the GPU usage of everyone.")


class UsageHandler(_AdminOnly):
    """/hub/gpulab/usage?window=7d: GPU-hours by user, project and GPU."""

    def _members(self, where: hubsettings.Layout) -> dict[str, list[str]]:
        named = report.budget_groups(where)
        if not named:
            return {}
        found = self.db.query(orm.Group).filter(orm.Group.name.in_(named)).all()
        return {g.name: [u.name for u in g.users] for g in found}

    @web.authenticated
    async def get(self):
        self._check_admin()
        window = self._window()
        where = hubsettings.of_handler(self)
        members = self._members(where)
        figures = await blocking.run(
            blocking.RECORDS, report.build, where, window, members, _labels
        )
        html = await self.render_template(
            "gpulab-usage.html",
            report=figures,
            windows=report.WINDOWS,
            usage_table=tables.usage.name,
        )
        self.finish(html)


class UsageCsvHandler(_AdminOnly):
    """/hub/gpulab/usage.csv?window=7d: the ended holdings of the window, as a download."""

    @web.authenticated
    async def get(self):
        self._check_admin()
        window = self._window()
        where = hubsettings.of_handler(self)
        text = await blocking.run(blocking.RECORDS, report.csv_text, where, window)
        day = time.strftime("%Y%m%d", time.gmtime())
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        self.set_header(
            "Content-Disposition", f'attachment; filename="gpulab-gpu-usage-{window}-{day}.csv"'
        )
        self.set_header("X-Content-Type-Options", "nosniff")
        self.finish(text)
