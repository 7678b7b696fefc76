"""The project server's "403" page, for someone whose access ended.

When an owner stops sharing a project (or a link's access ends), the person's
next page load there is refused by JupyterHub's identity provider ("user bob is
not allowed.") or by gpulab's authorizer, and jupyter_server showed its bare
"403 : Forbidden" page with no way back. jupyter_server renders ``403.html``
before ``error.html`` when it has one (JupyterLab's pages too, whose own
templates have none): :func:`install` puts gpulab's ``templates/403.html`` first
in the server's template search, with what it needs to say whose project it is
and where the person's own hub pages are.
"""

from __future__ import annotations

import os
from pathlib import Path

TEMPLATES = Path(__file__).with_name("templates")


def hub_links(environ=os.environ) -> dict[str, str]:
    """Template variables: the project's owner and name, the hub's home page and
    "Shared with me" page (on the hub's own host where it has one)."""
    hub = environ.get("JUPYTERHUB_HOST", "") + environ.get("JUPYTERHUB_BASE_URL", "/") + "hub/"
    return {
        "gpulab_owner": environ.get("JUPYTERHUB_USER", ""),
        "gpulab_project": environ.get("JUPYTERHUB_SERVER_NAME", ""),
        "gpulab_hub_home": hub + "home",
        "gpulab_hub_shared": hub + "gpulab/shared",
    }


def install(web_app_settings: dict) -> None:
    """gpulab's 403 page first in the server's templates (the settings' jinja2_env)."""
    from jinja2 import ChoiceLoader, FileSystemLoader

    env = web_app_settings.get("jinja2_env")
    if env is None or getattr(env.loader, "gpulab_403", False):
        return
    env.loader = ChoiceLoader([FileSystemLoader(str(TEMPLATES)), env.loader])
    env.loader.gpulab_403 = True
    web_app_settings.setdefault("jinja_template_vars", {}).update(hub_links())
