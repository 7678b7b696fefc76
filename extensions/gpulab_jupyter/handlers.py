"""REST handlers of the user side, under the versioned prefix /api/gpulab/v1/."""

import json
import os

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

API_PREFIX = "api/gpulab/v1"


def project_info(environ):
    """What this container knows about the project it serves (pure, for tests)."""
    return {
        "project": environ.get("GPULAB_PROJECT", ""),
        "owner": environ.get("GPULAB_OWNER", ""),
        "workspace": environ.get("GPULAB_WORKSPACE", os.getcwd()),
        "image": environ.get("JUPYTER_IMAGE_SPEC", ""),
    }


class InfoHandler(APIHandler):
    @tornado.web.authenticated
    def get(self):
        from . import __version__

        body = {"version": __version__, **project_info(os.environ)}
        self.finish(json.dumps(body))


def setup_handlers(web_app):
    base_url = web_app.settings["base_url"]
    web_app.add_handlers(
        ".*$",
        [(url_path_join(base_url, API_PREFIX, "info"), InfoHandler)],
    )
