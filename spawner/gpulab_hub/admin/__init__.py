"""The admin overview, /hub/gpulab/admin: what runs on this hub now. Users (approved,
or waiting for approval), every project and its state (running, starting, waiting for
a GPU, stopping, stopped, failed), who holds which GPU and since when (the GPU
allocation record), the starts waiting for a GPU (the GPU queue), image builds in
progress, and each user's disk use under the projects folder; with the actions an
admin needs, each a POST with JupyterHub's XSRF token that answers in a sentence on
the page: stop a project, delete a project (JupyterHub's own removal of a named
server, which runs gpulab's deletion: workflows/deletion.py), approve an account
(NativeAuthenticator's approval, as /hub/authorize does it).

Admins only (403 for everyone else). Importing this package is cheap (hubconfig.py
does, to wire the page); what the page reads off the event loop is in facts.py.
"""

from __future__ import annotations

from pathlib import Path

TEMPLATES = Path(__file__).with_name("templates")
PAGE = "/gpulab/admin"


def hub_handlers() -> list[tuple]:
    """JupyterHub ``extra_handlers``: the admin overview, for admins."""
    return [(PAGE, "gpulab_hub.admin.web.AdminHandler", {})]


def configure(c) -> None:
    """Wire the page into the hub's configuration ``c`` (after its ``template_paths``
    and ``extra_handlers`` are set): one call where the hub is configured."""
    handlers = c.JupyterHub.extra_handlers
    c.JupyterHub.extra_handlers = [
        *(handlers if isinstance(handlers, list) else []),
        *hub_handlers(),
    ]
    paths = c.JupyterHub.template_paths
    c.JupyterHub.template_paths = [*(paths if isinstance(paths, list) else []), str(TEMPLATES)]
