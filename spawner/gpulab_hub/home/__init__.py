"""gpulab's home page, and no default project.

``/hub/home`` is gpulab's own page (web.HomeHandler, templates/home.html): the
user's projects, each with its state, the GPUs it holds, its last build and its
actions (open, start, stop, share, rename, delete), creating a project (and
starting it at once), and the projects others shared with the user. Starting,
stopping, creating and deleting go through JupyterHub's REST API with the page's
XSRF token, as JupyterHub's own home page does.

JupyterHub always has a default server (named ''), which would make a hidden project
called ``default`` that sharing does not list; JupyterHub 6.1 has no setting that
removes it (``default_server_name`` only steers ``/hub/user-redirect``). So
``/hub/spawn``, ``/hub/spawn/<user>`` and ``/hub/user/<user>/`` of the user's own
default server lead to the home page with a word instead (web.py).

``/hub/spawn/<user>/<project>`` shows, on GET, the spawn form and never makes or
starts a project (JupyterHub's GET started one from a plain link): spawn.py.

JupyterHub puts only its authenticator's routes before its own, so
``GpulabAuthenticator.get_handlers`` adds :func:`front_handlers` there (the
patterns are JupyterHub's own, so they replace its handlers of those routes).
"""

from __future__ import annotations

from pathlib import Path

TEMPLATES = Path(__file__).with_name("templates")
PAGE = "/home"


def front_handlers() -> list[tuple[str, str]]:
    """Routes that replace JupyterHub's (same patterns), before its own in the list."""
    return [
        (PAGE, "gpulab_hub.home.web.HomeHandler"),
        (r"/spawn", "gpulab_hub.home.web.NoDefaultProjectHandler"),
        (r"/spawn/([^/]+)", "gpulab_hub.home.web.NoDefaultProjectHandler"),
        (r"/spawn/([^/]+)/([^/]+)", "gpulab_hub.home.spawn.SpawnPageHandler"),
        (r"/user/(?P<user_name>[^/]+)(?P<user_path>/.*)?", "gpulab_hub.home.web.UserUrlHandler"),
    ]
