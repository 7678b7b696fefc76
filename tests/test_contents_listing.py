"""A folder listed while one of its files is renamed (gpulab_jupyter/contents.py): the
listing is made again without it, where jupyter_server's own fails with 404 (what
JupyterLab's file browser shows as "Directory not found" after a Rename and Save)."""

from __future__ import annotations

import os

import pytest
from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from tornado import web

from gpulab_jupyter.contents import LISTING_TRIES, GpulabContentsManager


def renaming_between_listing_and_model(cm, folder, times: int = 1):
    """``cm`` whose model of ``Untitled<n>.ipynb`` is asked for just after the file was
    renamed to ``named<n>.ipynb`` (the rename lands after the folder's names were read
    and before that entry's model is made), ``times`` times."""
    real_get = cm.get
    done = []

    async def get(path, content=True, **kwargs):
        name = path.rsplit("/", 1)[-1]
        if name.startswith("Untitled") and len(done) < times:
            os.rename(folder / name, folder / name.replace("Untitled", "named"))
            done.append(name)
        return await real_get(path, content=content, **kwargs)

    cm.get = get
    return done


def _folder(tmp_path):
    for n in range(LISTING_TRIES + 1):
        (tmp_path / f"Untitled{n}.ipynb").write_text('{"cells": []}')
    (tmp_path / "data.csv").write_text("a,b\n")
    return tmp_path


async def test_jupyter_servers_own_listing_fails_when_a_file_is_renamed_meanwhile(tmp_path):
    cm = AsyncLargeFileManager(root_dir=str(_folder(tmp_path)))
    renaming_between_listing_and_model(cm, tmp_path)
    with pytest.raises(web.HTTPError) as e:
        await cm.get("", content=True)
    assert e.value.status_code == 404 and "No such file or directory" in e.value.log_message


async def test_gpulabs_listing_is_made_again_without_the_renamed_file(tmp_path):
    cm = GpulabContentsManager(root_dir=str(_folder(tmp_path)))
    renamed = renaming_between_listing_and_model(cm, tmp_path)
    model = await cm.get("", content=True)
    names = {entry["name"] for entry in model["content"]}
    assert len(renamed) == 1
    new = renamed[0].replace("Untitled", "named")
    assert new in names and renamed[0] not in names and "data.csv" in names


async def test_a_folder_that_keeps_changing_still_fails_and_a_missing_one_is_404(tmp_path):
    cm = GpulabContentsManager(root_dir=str(_folder(tmp_path)))
    renaming_between_listing_and_model(cm, tmp_path, times=LISTING_TRIES)
    with pytest.raises(web.HTTPError) as e:
        await cm.get("", content=True)
    assert e.value.status_code == 404
    with pytest.raises(web.HTTPError) as e:
        await GpulabContentsManager(root_dir=str(tmp_path)).get("nowhere", content=True)
    assert e.value.status_code == 404


def test_a_jupyter_server_with_gpulab_jupyter_uses_it_unless_configured_otherwise(tmp_path):
    """The server's file manager, as a JupyterLab with gpulab-jupyter makes it; an admin's
    ``ServerApp.contents_manager_class`` wins. (In a process of its own: a server's
    extensions patch jupyter_server's classes for the rest of the process.)"""
    import subprocess
    import sys

    code = (
        "import sys; from jupyter_server.serverapp import ServerApp; a = ServerApp(); "
        "a.initialize(argv=sys.argv[1:]); print(type(a.contents_manager).__name__)"
    )

    def manager(*argv: str) -> str:
        args = ["--allow-root", "--port=0", f"--ServerApp.root_dir={tmp_path}", *argv]
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.strip().splitlines()[-1]

    assert manager() == "GpulabContentsManager"
    chosen = "jupyter_server.services.contents.filemanager.AsyncFileContentsManager"
    assert manager(f"--ServerApp.contents_manager_class={chosen}") == "AsyncFileContentsManager"
