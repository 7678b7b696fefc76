"""A notebook nobody has open stays in memory while its cell runs (gpulab_jupyter/cells.py,
``keep_rooms``), so what the cell prints after jupyter-collaboration's clean-up delay
still reaches the .ipynb; and without a running cell the notebook leaves memory as
before. A real Jupyter server from this checkout's .venv (gpulab-jupyter,
jupyter-collaboration, jupyter-server-nbmodel) with a 2 s clean-up delay in place of 60 s,
a real kernel, the room's websocket opened as JupyterLab opens it and closed at once."""

from __future__ import annotations

import json
import time

import pytest
from cells_kit import (
    cell_text,
    code_cell,
    kernel_of,
    local_server,
    open_and_close_room,
    post_execute,
    put_notebook,
)

pytest.importorskip("jupyter_server_nbmodel")
CELL = (
    "import time\nfor i in range(1, 13):\n    print(f'line {i}', flush=True)\n    time.sleep(1)\n"
)


@pytest.fixture
def server(tmp_path):
    with local_server(tmp_path, "--YDocExtension.document_cleanup_delay=2",
                      "--ServerSideCells.keep_room_check_s=0.5") as client:  # fmt: skip
        yield client, tmp_path


def test_a_notebook_stays_in_memory_while_its_cell_runs_then_leaves(server):
    client, root = server
    put_notebook(client, "", "long.ipynb", [code_cell("l1", "")])
    kernel = kernel_of(client, "", "long.ipynb")
    room = open_and_close_room(client, "long.ipynb")
    r = post_execute(client.token, client.base, "", kernel, CELL, "l1", room, "long.ipynb")
    assert r.status_code == 202, r.text
    # 12 s of printing, six times the clean-up delay: every line reaches the file (waited
    # for, not slept: on a loaded machine the kernel's start and the saves take longer)
    want = [f"line {i}" for i in range(1, 13)]
    deadline = time.monotonic() + 90
    lines: list[str] = []
    while time.monotonic() < deadline:
        time.sleep(1)
        saved = json.loads((root / "long.ipynb").read_text())
        lines = [x for x in cell_text(saved, "l1").splitlines() if x.startswith("line ")]
        if lines == want:
            break
    assert lines == want, lines
    log = (root / "server.log").read_text()
    deadline = time.monotonic() + 45
    while f"Room {room} deleted" not in log and time.monotonic() < deadline:
        time.sleep(0.5)
        log = (root / "server.log").read_text()
    assert f"Room {room} deleted" in log, "the notebook stayed in memory after its cell ended"


def test_a_cell_that_ends_just_before_the_clean_up_still_reaches_the_file(tmp_path):
    # the save waits 4 s after a change, the clean-up comes 2 s after the tab closed:
    # jupyter-collaboration alone drops the document with its save still pending
    with local_server(tmp_path, "--YDocExtension.document_cleanup_delay=2",
                      "--YDocExtension.document_save_delay=4",
                      "--ServerSideCells.keep_room_check_s=0.5") as client:  # fmt: skip
        put_notebook(client, "", "quick.ipynb", [code_cell("q1", "")])
        kernel = kernel_of(client, "", "quick.ipynb")
        room = open_and_close_room(client, "quick.ipynb")
        r = post_execute(client.token, client.base, "", kernel, "print('quick')", "q1", room,
                         "quick.ipynb")  # fmt: skip
        assert r.status_code == 202, r.text
        log, deadline = "", time.monotonic() + 60
        while f"Room {room} deleted" not in log and time.monotonic() < deadline:
            time.sleep(0.5)
            log = (tmp_path / "server.log").read_text()
        assert f"Room {room} deleted" in log, log[-3000:]
        saved = json.loads((tmp_path / "quick.ipynb").read_text())
        assert cell_text(saved, "q1") == "quick\n", log[-3000:]
