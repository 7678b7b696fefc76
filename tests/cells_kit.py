"""Cells run on the server's side (gpulab_jupyter/cells.py), asked as people and
programs ask: the notebook's collaboration room, jupyter-server-nbmodel's execute
route, the notebook as saved on disk (the contents API reads the file)."""

from __future__ import annotations

import contextlib
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests
import websocket

PNG_1PX = (  # a 1x1 PNG
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9aw"
    "AAAABJRU5ErkJggg=="
)


def code_cell(cell_id: str, source: str) -> dict:
    return {"cell_type": "code", "id": cell_id, "execution_count": None, "metadata": {},
            "outputs": [], "source": source}  # fmt: skip


def put_notebook(user, server: str, path: str, cells: list[dict]) -> None:
    kernel = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    content = {"cells": cells, "metadata": {"kernelspec": kernel}, "nbformat": 4,
               "nbformat_minor": 5}  # fmt: skip
    r = user.api("PUT", f"{server}/api/contents/{path}",
                 json={"type": "notebook", "format": "json", "content": content})  # fmt: skip
    assert r.status_code in (200, 201), r.text


def saved(user, server: str, path: str) -> dict:
    """The notebook as its .ipynb on disk holds it."""
    r = user.api("GET", f"{server}/api/contents/{path}?content=1&type=notebook")
    assert r.status_code == 200, r.text
    return r.json()["content"]


def cell_text(nb: dict, cell_id: str) -> str:
    """What a cell printed: the text of its stream outputs, in order."""
    cell = next(c for c in nb["cells"] if c["id"] == cell_id)
    out = []
    for o in cell.get("outputs", []):
        if o["output_type"] == "stream":
            out.append(o["text"] if isinstance(o["text"], str) else "".join(o["text"]))
    return "".join(out)


def cell_of(nb: dict, cell_id: str) -> dict:
    return next(c for c in nb["cells"] if c["id"] == cell_id)


def room_id(user, server: str, path: str) -> str:
    r = user.api("PUT", f"{server}/api/collaboration/session/{path}",
                 json={"format": "json", "type": "notebook"})  # fmt: skip
    assert r.status_code in (200, 201), r.text
    return f"json:notebook:{r.json()['fileId']}"


def kernel_of(user, server: str, path: str, start: bool = True) -> str:
    """The kernel of ``path``'s session (started as JupyterLab starts one)."""
    for s in user.api("GET", f"{server}/api/sessions").json():
        if s.get("path") == path and s.get("kernel"):
            return s["kernel"]["id"]
    assert start, f"no session for {path}"
    r = user.api("POST", f"{server}/api/sessions", json={
        "path": path, "type": "notebook", "name": path, "kernel": {"name": "python3"}})  # fmt: skip
    assert r.status_code == 201, r.text
    return r.json()["kernel"]["id"]


def post_execute(token: str, base: str, server: str, kernel: str, code: str, cell_id: str,
                 room: str, path: str) -> requests.Response:  # fmt: skip
    """jupyter-server-nbmodel's route, as gpulab's cell executor posts to it."""
    return requests.post(
        f"{base}{server}/api/kernels/{kernel}/execute",
        headers={"Authorization": f"token {token}"},
        json={
            "code": code,
            "metadata": {"cell_id": cell_id, "document_id": room, "document_path": path},
        },  # fmt: skip
        timeout=30,
    )


def wait_done(token: str, base: str, server: str, kernel: str, request_id: str,
              timeout: float = 180) -> dict:  # fmt: skip
    deadline = time.monotonic() + timeout
    url = f"{base}{server}/api/kernels/{kernel}/requests/{request_id}"
    while time.monotonic() < deadline:
        r = requests.get(url, headers={"Authorization": f"token {token}"}, timeout=30)
        if r.status_code != 202:
            return {"status_code": r.status_code, **(r.json() if r.text else {})}
        time.sleep(0.5)
    raise AssertionError(f"request {request_id} still running after {timeout} s")


def running_cells(user, server: str) -> dict:
    r = user.api("GET", f"{server}/api/gpulab/v1/cells")
    assert r.status_code == 200, r.text
    return r.json()


def wait_idle(user, server: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cells = running_cells(user, server)
        if not cells["running"] and not cells["queued"]:
            return
        time.sleep(1)
    raise AssertionError(f"cells still running after {timeout} s: {running_cells(user, server)}")


class Client:
    """What the helpers above ask of a user: ``api`` with a token, ``base``, ``token``."""

    def __init__(self, base: str, token: str):
        self.base, self.token = base, token

    def api(self, method: str, path: str, **kw) -> requests.Response:
        kw.setdefault("timeout", 30)
        return requests.request(method, self.base + path,
                                headers={"Authorization": f"token {self.token}"}, **kw)  # fmt: skip


@contextlib.contextmanager
def local_server(root: Path, *args: str):
    """A real Jupyter server from this checkout's .venv (gpulab-jupyter,
    jupyter-collaboration, jupyter-server-nbmodel) serving ``root``; its log is
    ``root/server.log`` (its end printed when it stops)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    jupyter = Path(sys.executable).with_name("jupyter")
    log = open(root / "server.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [str(jupyter), "server", f"--port={port}", "--ServerApp.ip=127.0.0.1",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         "--allow-root", *args],  # fmt: skip
        stdout=log, stderr=subprocess.STDOUT, cwd=root,
    )  # fmt: skip
    client = Client(f"http://127.0.0.1:{port}", token)
    try:
        for _ in range(120):
            assert proc.poll() is None, (root / "server.log").read_text()[-3000:]
            with contextlib.suppress(requests.ConnectionError):
                if client.api("GET", "/api/status").ok:
                    break
            time.sleep(0.5)
        yield client
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
        print((root / "server.log").read_text()[-2000:])


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
