"""When the idle culler would stop this project, and why not yet; "keep it".

``GET /api/gpulab/v1/activity``: ``idle_timeout`` (seconds; 0: never stopped),
``last_activity`` (Unix seconds), ``stop_at`` (when the project is stopped if
nothing happens before; null when never), ``kept_by`` (what keeps it: ``job``,
``gpu``, ``cell`` (a cell running on the server's side), ``keep``, ``use``: a
browser, kernel or terminal). ``POST .../activity/keep`` counts as activity now (the
JupyterLab notice's "Keep it running" button): the project then has the whole
timeout again.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta

import tornado.web
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler

from gpulab_contract import environment

SOURCES = {"gpulab_jobs_last_activity": "job", "gpulab_gpu_last_activity": "gpu",
           "gpulab_keep_last_activity": "keep", "gpulab_cells_last_activity": "cell"}  # fmt: skip
RECENT = timedelta(minutes=2)


def idle_timeout(environ) -> int:
    """Seconds without activity before the hub stops the project (0: never)."""
    return environment.read(environ).idle_timeout_s


def activity_body(settings: dict, last: datetime, timeout: int, now: datetime) -> dict:
    """The answer, from the server's settings and last activity (pure, for tests)."""
    kept_by = sorted(
        name for key, name in SOURCES.items()
        if isinstance(settings.get(key), datetime) and now - settings[key] < RECENT
    )  # fmt: skip
    if not kept_by and now - last < RECENT:
        kept_by = ["use"]
    return {
        "idle_timeout": timeout,
        "last_activity": last.timestamp(),
        "stop_at": (last + timedelta(seconds=timeout)).timestamp() if timeout else None,
        "kept_by": kept_by,
    }


class ActivityHandler(APIHandler):
    auth_resource = "gpulab"
    # Asking when the project stops is no activity (JupyterLab asks on a timer, also
    # from a tab left in the background); "Keep it running" marks its own.
    _track_activity = False

    def _body(self) -> dict:
        last = self.serverapp.web_app.last_activity()
        if last.tzinfo is None:
            last = last.replace(tzinfo=UTC)
        return activity_body(
            self.serverapp.web_app.settings, last, idle_timeout(os.environ), datetime.now(UTC)
        )

    @tornado.web.authenticated
    @authorized
    def get(self):
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(self._body()))


class KeepHandler(ActivityHandler):
    @tornado.web.authenticated
    @authorized
    def post(self):
        self.serverapp.web_app.settings["gpulab_keep_last_activity"] = datetime.now(UTC)
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(self._body()))


def routes(prefix: str) -> list[tuple[str, type]]:
    return [(f"{prefix}/activity", ActivityHandler), (f"{prefix}/activity/keep", KeepHandler)]
