"""Jupyter Server's file manager, whose folder listing survives a file going away.

jupyter_server 2.21 (up to its main branch, checked 2026-12) lists a folder by taking
its names, then each entry's model; a file renamed or removed in between makes that
second step raise 404, which fails the whole listing. JupyterLab's file browser, which
lists the folder again after every save and rename, then shows "Directory not found"
for the folder it is in. Seen after "Rename and Save" on a new notebook on a loaded
2-core machine: 3 of 8 renames (the server's log: ``404 GET /api/contents ... No such
file or directory: Untitled.ipynb``).

Here a listing that fails so, for a folder that is still there, is made again (a few
times): the entry that went away is then not in it. Anything else is as jupyter_server
does it. gpulab-jupyter's server extension makes it the server's file manager as the
server links it (:func:`choose`), unless ``ServerApp.contents_manager_class`` was set.
"""

from __future__ import annotations

import os

from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from tornado import web

LISTING_TRIES = 3


def choose(serverapp, log) -> bool:
    """Make :class:`GpulabContentsManager` ``serverapp``'s file manager, unless its
    configuration names one; whether it did. Called as the server links its extensions,
    before it makes its file manager."""
    if "contents_manager_class" in serverapp.config.get("ServerApp", {}):
        return False
    if serverapp.contents_manager_class is not AsyncLargeFileManager:
        return False
    serverapp.contents_manager_class = GpulabContentsManager
    log.info("gpulab: folder listings survive a file renamed meanwhile (gpulab_jupyter.contents)")
    return True


class GpulabContentsManager(AsyncLargeFileManager):
    """jupyter_server's default file manager; a folder's listing is made again when
    one of its entries went away while it was being made."""

    async def _dir_model(self, path, content=True):
        attempt = 1
        while True:
            try:
                return await super()._dir_model(path, content=content)
            except web.HTTPError as e:
                again = e.status_code == 404 and content and attempt < LISTING_TRIES
                if not again or not os.path.isdir(self._get_os_path(path)):
                    raise
                self.log.info("gpulab: %r changed while it was listed (%s): again", path, e)
                attempt += 1
