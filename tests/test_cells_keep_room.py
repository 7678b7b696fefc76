"""A notebook nobody has open stays in memory while its cell runs (gpulab_jupyter/cells.py,
``keep_rooms``), so what the cell prints after jupyter-collaboration's clean-up delay
still reaches the .ipynb; and without a running cell the notebook leaves memory as
before. A real Jupyter server from this checkout's .venv (gpulab-jupyter,
jupyter-collaboration, jupyter-server-nbmodel) with a 2 s clean-up delay in place of 60 s,
a real kernel, the room's websocket opened as JupyterLab opens it and closed at once."""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import websocket
from cells_kit import cell_text, code_cell, kernel_of, post_execute, put_notebook, room_id

pytest.importorskip("jupyter_server_nbmodel")
JUPYTER = Path(sys.executable).with_name("jupyter")
CELL = (
    "import time\nfor i in range(1, 13):\n    print(f'line {i}', flush=True)\n    time.sleep(1)\n"
)


class Client:
    """What cells_kit asks of a user: ``api`` with a token, ``base``, ``token``."""

    def __init__(self, base: str, token: str):
        self.base, self.token = base, token

    def api(self, method: str, path: str, **kw) -> requests.Response:
        kw.setdefault("timeout", 30)
        return requests.request(method, self.base + path,
                                headers={"Authorization": f"token {self.token}"}, **kw)  # fmt: skip


@pytest.fixture
def server(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [str(JUPYTER), "server", f"--port={port}", "--ServerApp.ip=127.0.0.1",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}",
         "--allow-root", "--YDocExtension.document_cleanup_delay=2",
         "--ServerSideCells.keep_room_check_s=0.5"],  # fmt: skip
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
    )  # fmt: skip
    client = Client(f"http://127.0.0.1:{port}", token)
    try:
        for _ in range(120):
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            with contextlib.suppress(requests.ConnectionError):
                if client.api("GET", "/api/status").ok:
                    break
            time.sleep(0.5)
        yield client, tmp_path
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
        print((tmp_path / "server.log").read_text()[-2000:])


def open_and_close_room(client: Client, path: str) -> str:
    room = room_id(client, "", path)
    body = {"format": "json", "type": "notebook"}
    session = client.api("PUT", f"/api/collaboration/session/{path}", json=body).json()
    session = session["sessionId"]
    ws = websocket.create_connection(
        client.base.replace("http", "ws", 1)
        + f"/api/collaboration/room/{room}?sessionId={session}",
        header=[f"Authorization: token {client.token}"],
        timeout=20,
    )
    ws.recv()  # the room answered: its document is loaded
    ws.close()
    return room


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
