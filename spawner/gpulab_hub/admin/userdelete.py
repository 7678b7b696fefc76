"""Deleting a user, only when meant: the account and every project of theirs go at once
(workflows/deletion.py), so it asks first, as deleting one project does.

- JupyterHub's REST API ``DELETE /hub/api/users/<name>`` (what JupyterHub's own admin
  page sends on one click of "Delete User") is refused unless the request names the user
  again: ``?confirm=<name>``. A script that means it says so; the click deletes nothing.
- gpulab's admin overview (/hub/gpulab/admin) deletes a user after the admin typed the
  user's name (admin/web.py), through the same steps as JupyterHub's API.
"""

from __future__ import annotations

from jupyterhub.apihandlers.users import UserAPIHandler
from jupyterhub.scopes import needs_scope
from jupyterhub.utils import maybe_future
from tornado import web

from gpulab_hub.admin import PAGE

# JupyterHub's route of one user in its REST API (jupyterhub/apihandlers/users.py).
ROUTE = r"/api/users/([^/]+)"


def refusal(name: str) -> str:
    return (
        f"Deleting {name} removes the account and all of their projects and files. "
        f"Delete users from gpulab's admin overview (/hub{PAGE}), which asks for the "
        f"user's name first; through the API, say it again: ?confirm={name}"
    )


class ConfirmedUserAPIHandler(UserAPIHandler):
    """JupyterHub's /hub/api/users/<name>, whose DELETE needs ``?confirm=<name>``."""

    @needs_scope("admin:users")
    async def delete(self, user_name):
        if self.get_query_argument("confirm", "") != user_name:
            raise web.HTTPError(400, refusal(user_name))
        return await super().delete(user_name)


def hub_handlers() -> list[tuple]:
    """Routes before JupyterHub's own (accounts/auth.py GpulabHub.gpulab_routes)."""
    return [(ROUTE, ConfirmedUserAPIHandler)]


async def delete_user(handler, user) -> None:
    """What JupyterHub's DELETE /hub/api/users/<name> does once confirmed, for a page
    handler (``handler``: a JupyterHub BaseHandler): stop the user's servers, gpulab's
    deletion of their files and records (the authenticator's delete_user), their
    spawners, the account."""
    if user.name == handler.current_user.name:
        raise web.HTTPError(400, "You cannot delete your own account.")
    await maybe_future(handler.authenticator.delete_user(user))
    await user.delete_spawners()
    handler.users.delete(user)
