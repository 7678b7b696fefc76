"""A new notebook's first cell on the server's side waits for no connection of its own:
the server connects its kernel client as the kernel starts (gpulab_jupyter/cells.py,
``connect_early``), while the person types, where jupyter-server-nbmodel connected it
(and waited for the kernel's handshake) only once the first cell came. The connection is
made once: a first cell posted while it is under way shares it, and prints once.

A real Jupyter server from this checkout's .venv and a real kernel
(test_cells_keep_room.py's server)."""

from __future__ import annotations

import json
import time

from cells_kit import (
    cell_text,
    code_cell,
    kernel_of,
    open_and_close_room,
    post_execute,
    put_notebook,
)
from test_cells_keep_room import server  # noqa: F401 - the fixture

CONNECTED = "the server's client of kernel {} connected in"


def wait_for_log(root, text: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    log = ""
    while time.monotonic() < deadline:
        log = (root / "server.log").read_text()
        if text in log:
            return log
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not in the server's log:\n{log[-3000:]}")


def saved_lines(root, path: str, cell_id: str) -> list[str]:
    return cell_text(json.loads((root / path).read_text()), cell_id).splitlines()


def test_the_kernel_client_connects_as_the_kernel_starts_once_for_its_first_cell(server):  # noqa: F811
    client, root = server
    # A kernel started and no cell yet: the server's client connects by itself.
    put_notebook(client, "", "typing.ipynb", [code_cell("t1", "")])
    kernel = kernel_of(client, "", "typing.ipynb")
    wait_for_log(root, CONNECTED.format(kernel))
    # A first cell posted as soon as the tab is open, the connection perhaps under way.
    put_notebook(client, "", "at-once.ipynb", [code_cell("a1", "")])
    at_once = kernel_of(client, "", "at-once.ipynb")
    room = open_and_close_room(client, "at-once.ipynb")  # JupyterLab's tab, as it opens
    r = post_execute(client.token, client.base, "", at_once, "print('first')", "a1", room,
                     "at-once.ipynb")  # fmt: skip
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "first" not in saved_lines(root, "at-once.ipynb", "a1"):
        time.sleep(0.5)
    log = (root / "server.log").read_text()
    assert saved_lines(root, "at-once.ipynb", "a1") == ["first"], log[-3000:]
    log = wait_for_log(root, CONNECTED.format(at_once))
    assert log.count(CONNECTED.format(at_once)) == 1
    assert "no early connection" not in log
