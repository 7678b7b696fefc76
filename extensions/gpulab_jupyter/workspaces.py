"""Each person's own JupyterLab layout in a shared project.

JupyterLab keeps a layout (open tabs, panels, their sizes) per workspace, in the
project server's workspaces folder, and ``/lab`` opens the workspace ``default``: the
owner's. Everyone a project is shared with opened on the owner's layout, and what they
opened or closed changed it for the owner. Under gpulab's hub, a visitor other than the
owner who asks for ``/lab`` (or ``/doc``, ``/lab/tree/<path>``) without naming a
workspace is sent to their own, ``/lab/workspaces/<their workspace>/...``
(:func:`workspace_of`): JupyterLab's default layout the first time, theirs after. The
owner keeps ``default``. A workspace named in the address is left as it is.
"""

from __future__ import annotations

import functools
import os
import re

# The login name of a visitor, as the hub accepts it (gpulab_hub.accounts'
# USERNAME_PATTERN): anything else gets no workspace of its own.
VISITOR = re.compile(r"[a-z0-9][a-z0-9._@+-]{0,63}")
# What JupyterLab's page route takes as a workspace name.
PLAIN = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")
PREFIX = "gpulab-"
LAB_HANDLER = "jupyterlab_server.handlers.LabHandler"


def workspace_of(visitor: str, owner: str) -> str | None:
    """The JupyterLab workspace of ``visitor`` in ``owner``'s project: None for the
    owner (``default``) and for a name outside the hub's; else ``gpulab-<name>``, each
    character JupyterLab's route does not take written ``_xx`` (its code in hex), so
    two names never share one."""
    if not visitor or visitor == owner or not VISITOR.fullmatch(visitor):
        return None
    return PREFIX + "".join(c if c in PLAIN else f"_{ord(c):02x}" for c in visitor)


def _own_layout(get, owner: str):
    @functools.wraps(get)
    def redirecting_get(self, mode=None, workspace=None, tree=None):
        user = self.current_user
        name = getattr(user, "username", "") if user is not None else ""
        target = workspace_of(name, owner) if workspace is None else None
        prefix = f"{self.base_url.rstrip('/')}/{mode}"
        path = self.request.path
        if target and mode in ("lab", "doc") and path.rstrip("/").startswith(prefix):
            rest = path.rstrip("/")[len(prefix) :]
            query = f"?{self.request.query}" if self.request.query else ""
            self.redirect(f"{prefix}/workspaces/{target}{rest}{query}")
            return None
        return get(self, mode=mode, workspace=workspace, tree=tree)

    redirecting_get.__gpulab_own_layout__ = True
    return redirecting_get


def own_layouts(rules, environ=os.environ) -> list[str]:
    """JupyterLab's page handler among ``rules`` sends visitors to their own workspace
    (the owner: ``$JUPYTERHUB_USER``); names of the classes changed here."""
    owner = environ.get("JUPYTERHUB_USER", "")
    done = []
    for cls in {rule.target for rule in rules}:
        if f"{cls.__module__}.{cls.__qualname__}" != LAB_HANDLER or not owner:
            continue
        if getattr(cls.get, "__gpulab_own_layout__", False):
            continue
        cls.get = _own_layout(cls.get, owner)
        done.append(LAB_HANDLER)
    return done
