"""The launcher's TensorBoard tile (jupyter-server-proxy's ``jupyter_serverproxy_servers``
entry point, pyproject.toml): TensorBoard on the project's files, started at the tile's
first visit behind the project's own address (``<project>/tensorboard/``). Its icon is
drawn by gpulab's front end (style/launcher.css): jupyter-server-proxy's draws an
``icon_path`` in the Notebook and Console sections only. Who may open it: authorizer.py
(those who may run code)."""

from __future__ import annotations

# Every TensorBoard event file under the project (docs/jobs.md).
LOGDIR = "/workspace"


def server() -> dict:
    """jupyter-server-proxy's settings of the ``tensorboard`` server."""
    return {
        "command": [
            "tensorboard", "--logdir", LOGDIR, "--host", "127.0.0.1",
            "--port", "{port}", "--path_prefix", "{base_url}tensorboard",
        ],  # fmt: skip
        "absolute_url": True,
        "timeout": 60,
        "new_browser_tab": False,
        # style/launcher.css finds the tile by this title and category
        "launcher_entry": {"title": "TensorBoard", "category": "Other"},
    }
