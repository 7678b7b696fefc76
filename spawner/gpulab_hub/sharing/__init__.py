"""Collaborator sharing of projects, on JupyterHub 6's own sharing API.

The hub page /hub/gpulab/share/<project> lets a project's owner share it with
a user or a group, make an expiring link (a JupyterHub share code, accepted at
/hub/accept-share), see who has access, and revoke. hubconfig.py wires it.
"""

from __future__ import annotations

from pathlib import Path

from gpulab_hub.settings import DEFAULT
from gpulab_hub.sharing import roles

TEMPLATES = Path(__file__).with_name("templates")
PAGE = "/gpulab/share"
DEFAULT_LINK_HOURS = 24
# Project servers cache the hub's token checks this long, so revoking takes this long:
# the default of GPULAB_REVOKE_WITHIN_S (the settings' sharing.revoke_within_s).
REVOKE_WITHIN_S = DEFAULT.sharing.revoke_within_s

# Every user may share their own projects. Not ``read:users:name``, which
# JupyterHub's API wants for sharing by name: it would let users list each other;
# the share page grants by name itself. Owners may do everything on their own
# project servers (gpulab's ``execute`` scope, which the servers' authorizer asks for).
USER_ROLE = {
    "name": "user",
    "description": "Standard user privileges, plus sharing one's own projects",
    "scopes": ["self", "shares!user", *roles.OWNER_SCOPES],
}


def hub_handlers(max_hours: int, *, public_links: bool = False) -> list[tuple]:
    """JupyterHub ``extra_handlers``: the share page of each of the user's projects;
    "save a copy" (copy.py); "shared with me" (received.py); public links (public.py).
    Where their records live comes from the hub's configuration (hubsettings.py)."""
    files = {"public_links": public_links}
    return [
        (
            # /<project> for its owner; /<owner>/<project> for a collaborator re-sharing
            PAGE + r"/([^/]+)(?:/([^/]+))?",
            "gpulab_hub.sharing.web.ShareHandler",
            {"max_hours": max_hours, "default_hours": min(DEFAULT_LINK_HOURS, max_hours)},
        ),
        (r"/gpulab/copy", "gpulab_hub.sharing.copy.CopyHandler", files),
        (r"/gpulab/shared", "gpulab_hub.sharing.received.SharedWithMeHandler", files),
        (
            r"/gpulab/public-links/([^/]+)",
            "gpulab_hub.sharing.public.PublicLinksHandler",
            {**files, "max_hours": max_hours},
        ),
        (
            r"/gpulab/p/([^/]+)",
            "gpulab_hub.sharing.public.PublicNotebookHandler",
            {**files, "max_hours": max_hours},
        ),
    ]
