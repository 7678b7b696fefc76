"""``GET /hub/api/gpulab/reclaim/<owner>/<project>``: whether the project is warned that
it stops unless used (the GPU keeper's reclaim record), for its JupyterLab.

Answer (JSON)::

    {"warned": bool, "reason": "waiting" | "idle" | "", "stops_at": <epoch s> | null,
     "words": "someone is waiting for this GPU: this project stops in 10 min unless
               you use it (its files are kept)" | ""}

Who may ask: the project server's own token (``$JUPYTERHUB_API_TOKEN`` in its
container) for its own project only, and the project's owner and collaborators; a
viewer, another user and an admin without a share get 404 (as for a project that does
not exist), anonymous requests 403 (the rule of cluster/jobsapi.py, whose check this
reuses).
"""

from __future__ import annotations

import json
import time

from tornado import web

from gpulab_hub import blocking, hubsettings, jsonfile
from gpulab_hub.cluster.jobsapi import _Base
from gpulab_hub.gpus import reclaimrecord

API = "/api/gpulab/reclaim"
READERS = ("server", "owner", "collaborator")


def hub_handlers() -> list[tuple]:
    """JupyterHub ``extra_handlers``."""
    return [(API + r"/([^/]+)/([^/]+)", "gpulab_hub.gpus.reclaimapi.ReclaimHandler")]


def answer(w: reclaimrecord.Warning | None, now: float) -> dict:
    """The JSON for a standing warning (or none), ``now`` (pure)."""
    if w is None:
        return {"warned": False, "reason": "", "stops_at": None, "words": ""}
    return {
        "warned": True,
        "reason": w.reason,
        "stops_at": w.stops_at,
        "words": reclaimrecord.words_of(w, now),
    }


class ReclaimHandler(_Base):
    async def get(self, owner: str, project: str):
        role, _ = self.access(owner, project)
        if role not in READERS:
            raise web.HTTPError(404, f"No project {owner}/{project}.")
        where = hubsettings.of_handler(self)
        try:
            w = await blocking.run(
                blocking.RECORDS, reclaimrecord.warning_of, where.allocations_file, owner, project
            )
        except (jsonfile.RecordError, OSError) as e:
            self.log.warning("gpulab: the GPU reclaim record cannot be read: %s", e)
            w = None
        self.set_header("Content-Type", "application/json")
        self.write(json.dumps(answer(w, time.time())))
