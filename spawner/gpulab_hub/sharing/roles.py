"""The two share roles, as JupyterHub scopes.

JupyterHub shares carry scopes limited to one server (``!server=owner/project``).
``access:servers`` lets a person reach the project's server at all; gpulab's
custom scopes then say what they may do there. The project image's authorizer
(``gpulab_jupyter.authorizer``) reads them on every request:

- viewer: ``read`` (open and read notebooks and files; nothing that writes,
  starts kernels or opens terminals);
- collaborator: ``execute``, which includes ``write`` and ``read``.

Owners hold ``execute`` on their own servers through the ``user`` role.
"""

from __future__ import annotations

PREFIX = "custom:gpulab:"
READ, WRITE, EXECUTE = PREFIX + "read", PREFIX + "write", PREFIX + "execute"

# c.JupyterHub.custom_scopes: the descriptions show on JupyterHub's accept-share page.
CUSTOM_SCOPES = {
    READ: {"description": "open and read the project's notebooks and files (read-only)"},
    WRITE: {
        "description": "edit and save the project's files",
        "subscopes": [READ],
    },
    EXECUTE: {
        "description": "run code in the project: kernels and terminals",
        "subscopes": [WRITE, READ],
    },
}

ROLES = {"viewer": READ, "collaborator": EXECUTE}
# The least a share gives, unless the owner chooses more (the Share page's default).
DEFAULT_ROLE = "viewer"
# What each role lets a person do, in the words of the pages that offer a share.
ROLE_WORDS = {
    "viewer": "you can read its notebooks and save copies, not run code",
    "collaborator": "you can edit its files and run code in it (kernels and terminals)",
    "access only": "you can reach its server but do nothing there until the owner gives a role",
}

# What a project server asks the hub to include in the tokens it is given, so its
# authorizer sees them (c.Spawner.oauth_client_allowed_scopes).
SERVER_CLIENT_SCOPES = [f"{scope}!server" for scope in (READ, WRITE, EXECUTE)]
# Added to the ``user`` role: full rights on one's own servers.
OWNER_SCOPES = [f"{EXECUTE}!user"]
# The project server's own token (c.Spawner.server_token_scopes): JupyterHub's
# ``server`` role, its activity narrowed to this one server (JupyterHub's role has
# ``users:activity!user``: every project of the owner; sharing/activity.py lets the
# narrowed scope report), plus reading the server's shares. JupyterHub puts no
# share's custom scopes into the browser's OAuth token, so the authorizer looks the
# person's share up in this list.
SERVER_TOKEN_SCOPES = ["users:activity!server", "access:servers!server", "read:shares!server"]
# The project server's authorizer, installed in the project image (gpulab-jupyter).
AUTHORIZER_CLASS = "gpulab_jupyter.authorizer.ProjectAuthorizer"


def share_scopes(role: str, owner: str, project: str) -> list[str]:
    """The scopes of a share of ``owner/project`` in ``role`` (ValueError if unknown)."""
    if role not in ROLES:
        raise ValueError(f"Unknown role {role!r}: choose one of {', '.join(sorted(ROLES))}.")
    server = f"server={owner}/{project}"
    return [f"access:servers!{server}", f"{ROLES[role]}!{server}"]


def role_of(scopes) -> str:
    """The role a share's scopes give: "collaborator", "viewer", or "access only" (a
    share without gpulab's scopes reaches the server, and its authorizer refuses it)."""
    bases = {s.partition("!")[0] for s in scopes}
    if EXECUTE in bases:
        return "collaborator"
    if READ in bases or WRITE in bases:
        return "viewer"
    return "access only"


def role_on(db, person, spawner) -> str:
    """``person``'s (``orm.User``) share role on someone else's project (``orm.Spawner``):
    through their own share or one of their groups'; "" for none."""
    from jupyterhub import orm

    scopes: set[str] = set()
    for target in (person, *person.groups):
        share = orm.Share.find(db, spawner, target)
        if share is not None:
            scopes.update(share.scopes)
    return role_of(scopes)
