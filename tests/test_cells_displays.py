"""What cells run on the server's side show besides prints, with no browser open:
a display updated through its handle (``display_id=True`` then ``.update``, in the cell
and from a later cell: gpulab_jupyter/displays.py, which jupyter-server-nbmodel 0.2.9
lacks), a tqdm progress bar, a matplotlib figure; and Jupyter widgets with a page's
kernel connection open: the server's kernel client leaves the widget's comm alone,
the page's connection gets the comm_open on iopub, and what the page sends back (a
slider moved) reaches the widget in the kernel.

A real Jupyter server from this checkout's .venv, a real kernel, cells posted as
gpulab's cell executor posts them, the notebook read back from its .ipynb on disk."""

from __future__ import annotations

import json
import time
import uuid

import pytest
import websocket
from cells_kit import (
    cell_of,
    cell_text,
    code_cell,
    kernel_of,
    local_server,
    open_and_close_room,
    post_execute,
    put_notebook,
    wait_done,
)

pytest.importorskip("jupyter_server_nbmodel")

HANDLE = """from IPython.display import display
import time
h = display({'text/plain': 'step 0'}, raw=True, display_id=True)
for i in range(1, 6):
    time.sleep(0.2)
    h.update({'text/plain': f'step {i}'}, raw=True)
print('handle made')
"""
LATER = """h.update({'text/plain': 'final from a later cell'}, raw=True)
g = display({'text/plain': 'second 0'}, raw=True, display_id=True)
g.update({'text/plain': 'second 1'}, raw=True)
print('later done')
"""
TQDM = """from tqdm import tqdm
import time
for _ in tqdm(range(30), ncols=60, mininterval=0):
    time.sleep(0.05)
"""
FIGURE = """import matplotlib.pyplot as plt
plt.plot([1, 3, 2])
plt.title('away')
plt.show()
"""


@pytest.fixture
def server(tmp_path):
    with local_server(tmp_path) as client:
        yield client, tmp_path


def run_cells(client, path: str, cells: list[tuple[str, str]]) -> None:
    """Post ``cells`` in order (as Run All), the notebook's room closed: nobody looks."""
    put_notebook(client, "", path, [code_cell(cid, src) for cid, src in cells])
    kernel = kernel_of(client, "", path)
    room = open_and_close_room(client, path)
    for cid, src in cells:
        r = post_execute(client.token, client.base, "", kernel, src, cid, room, path)
        assert r.status_code == 202, r.text
        done = wait_done(client.token, client.base, "", kernel, r.json()["request_id"])
        assert done.get("status") == "ok", done


def saved_when(root, path: str, ok, timeout: float = 60) -> dict:
    """The .ipynb on disk once ``ok(notebook)`` (it saves itself a second after a change)."""
    deadline = time.monotonic() + timeout
    nb: dict = {}
    while time.monotonic() < deadline:
        try:
            nb = json.loads((root / path).read_text())
        except (OSError, ValueError):
            nb = {}
        if nb and ok(nb):
            return nb
        time.sleep(0.5)
    raise AssertionError(f"the saved notebook never got there: {json.dumps(nb)[:3000]}")


def shown(cell: dict) -> list[str]:
    """The text/plain of each display of a cell."""
    out = []
    for o in cell.get("outputs", []):
        if o["output_type"] in ("display_data", "execute_result"):
            t = o["data"].get("text/plain", "")
            out.append(t if isinstance(t, str) else "".join(t))
    return out


def test_a_display_updated_while_away_shows_its_last_value_once(server):
    client, root = server
    run_cells(client, "handle.ipynb", [("d1", HANDLE), ("d2", LATER)])

    def final(nb):
        return shown(cell_of(nb, "d1")) == ["final from a later cell"] and "later done" in (
            cell_text(nb, "d2")
        )

    nb = saved_when(root, "handle.ipynb", final)
    d1, d2 = cell_of(nb, "d1"), cell_of(nb, "d2")
    # the first cell: its one display, replaced in place (by the later cell last), then its print
    assert [o["output_type"] for o in d1["outputs"]] == ["display_data", "stream"], d1
    assert cell_text(nb, "d1") == "handle made\n"
    # the later cell: its own handle's display updated once, nothing of the first cell's
    assert shown(d2) == ["second 1"], d2
    text = json.dumps([d1["outputs"], d2["outputs"]])
    for gone in ("step 0", "step 3", "step 5", "second 0"):
        assert gone not in text, gone


def test_a_tqdm_bar_and_a_figure_made_while_away_are_in_the_notebook(server):
    client, root = server
    run_cells(client, "bar.ipynb", [("t1", TQDM), ("f1", FIGURE)])

    def there(nb):
        figure = cell_of(nb, "f1").get("outputs", [])
        return "30/30" in cell_text(nb, "t1") and any(
            "image/png" in o.get("data", {}) for o in figure
        )

    nb = saved_when(root, "bar.ipynb", there)
    bar = cell_text(nb, "t1")
    # one line, rewritten in place: the bar's last state, no line per update
    assert bar.count("\n") <= 1 and "\r" not in bar.rstrip("\r\n"), repr(bar)
    assert "100%" in bar and bar.count("30/30") == 1, repr(bar)
    figure = [o for o in cell_of(nb, "f1")["outputs"] if "image/png" in o.get("data", {})]
    assert len(figure) == 1, cell_of(nb, "f1")
    assert len(figure[0]["data"]["image/png"]) > 1000  # a drawn plot, base64 PNG


def kernel_socket(client, kernel: str) -> websocket.WebSocket:
    """The kernel connection a JupyterLab page opens (JSON messages)."""
    return websocket.create_connection(
        client.base.replace("http", "ws", 1)
        + f"/api/kernels/{kernel}/channels?session_id={uuid.uuid4().hex}",
        header=[f"Authorization: token {client.token}"],
        timeout=5,
    )


def until(ws, pred, timeout: float = 60) -> tuple[dict | None, list[dict]]:
    """Messages read until ``pred(msg)``: (that message or None, all read)."""
    deadline, seen = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        try:
            msg = json.loads(ws.recv())
        except websocket.WebSocketTimeoutException:
            continue
        seen.append(msg)
        if pred(msg):
            return msg, seen
    return None, seen


def test_a_widget_made_on_the_server_side_lives_in_the_pages_connection(server):
    client, root = server
    path = "widget.ipynb"
    cells = [("w1", "import ipywidgets\nw = ipywidgets.IntSlider(value=3)\ndisplay(w)\n"),
             ("w2", "print('slider at', w.value)\n")]  # fmt: skip
    put_notebook(client, "", path, [code_cell(cid, src) for cid, src in cells])
    kernel = kernel_of(client, "", path)
    room = open_and_close_room(client, path)
    page = kernel_socket(client, kernel)  # the open tab's kernel connection
    try:
        r = post_execute(client.token, client.base, "", kernel, cells[0][1], "w1", room, path)
        assert r.status_code == 202, r.text
        opened, _ = until(page, lambda m: m["header"]["msg_type"] == "comm_open"
                          and m["content"].get("target_name") == "jupyter.widget"
                          and m["content"]["data"]["state"].get("_model_name")
                          == "IntSliderModel")  # fmt: skip
        assert opened is not None, "the page's connection never got the slider's comm_open"
        comm_id = opened["content"]["comm_id"]
        done = wait_done(client.token, client.base, "", kernel, r.json()["request_id"])
        assert done.get("status") == "ok", done
        # the slider's view is in the notebook, naming the model the page holds
        nb = saved_when(root, path, lambda nb: any(
            "application/vnd.jupyter.widget-view+json" in o.get("data", {})
            for o in cell_of(nb, "w1").get("outputs", [])))  # fmt: skip
        view = next(o["data"]["application/vnd.jupyter.widget-view+json"]
                    for o in cell_of(nb, "w1")["outputs"]
                    if "application/vnd.jupyter.widget-view+json" in o.get("data", {}))  # fmt: skip
        assert view["model_id"] == comm_id
        # the page moves the slider, as the widget manager sends it
        page.send(json.dumps({
            "header": {"msg_id": uuid.uuid4().hex, "msg_type": "comm_msg", "username": "",
                       "session": uuid.uuid4().hex, "date": "", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"comm_id": comm_id,
                        "data": {"method": "update", "state": {"value": 7},
                                 "buffer_paths": []}},
        }))  # fmt: skip
        echoed, seen = until(page, lambda m: m["header"]["msg_type"] == "comm_msg"
                             and m["content"].get("comm_id") == comm_id
                             and m["content"]["data"].get("method") == "echo_update",
                             timeout=20)  # fmt: skip
        # ipywidgets 8 echoes an update to every page; no one closed the comm
        assert echoed is not None, [m["header"]["msg_type"] for m in seen]
        closes = [m for m in seen if m["header"]["msg_type"] == "comm_close"]
        assert not closes, closes
        r = post_execute(client.token, client.base, "", kernel, cells[1][1], "w2", room, path)
        assert r.status_code == 202, r.text
        wait_done(client.token, client.base, "", kernel, r.json()["request_id"])
        nb = saved_when(root, path, lambda nb: "slider at" in cell_text(nb, "w2"))
        assert cell_text(nb, "w2") == "slider at 7\n"
    finally:
        page.close()
