"""``POST /hub/api/users/<name>/activity``: a project server reports its own activity only.

A project server's own token (``$JUPYTERHUB_API_TOKEN``, in the container's environment,
readable by everyone who runs code there, collaborators included) holds
``users:activity!server`` (roles.SERVER_TOKEN_SCOPES), expanded by JupyterHub to
``users:activity!server=<owner>/<project>``: activity of that one server. JupyterHub's
own role for servers holds ``users:activity!user``, which let the token bump the
activity of every project of the owner (its ``servers`` dict names any of them), so a
collaborator could keep the owner's other projects, and the GPUs they hold, from the
idle culler.

JupyterHub 6.1 adds ``users:activity!user`` to every server token whatever
``server_token_scopes`` asks (``User.spawn``: "ensure activity scope is requested"), so
:func:`narrow_server_token` (the authenticator's ``pre_spawn_start``, which runs once the
token is made and before the server gets it) replaces it with the server's own.

JupyterHub 6.1 checks this route's scope on the user alone, so a server-filtered scope
would refuse every report, the server's own included (and the culler would stop busy
projects). :class:`ServerActivityHandler` replaces JupyterHub's handler of that route
(same pattern, placed before JupyterHub's own by the authenticator): a token with
``users:activity`` on the user is JupyterHub's case; a token holding it for some of the
user's servers may report those servers (and, with them, the user's last activity, as
``jupyterhub-singleuser`` sends both) and gets 403 for any other server or a report
without one.
"""

from __future__ import annotations

from jupyterhub.apihandlers.users import ActivityAPIHandler
from jupyterhub.scopes import Scope
from tornado import web

SCOPE = "users:activity"
ROUTE = r"/api/users/([^/]+)/activity"


def narrow_server_token(db, spawner) -> None:
    """Make ``spawner``'s own token (``spawner.api_token``, just made for this start)
    report activity for that server only: JupyterHub's whole-user activity scope out,
    ``users:activity!server=<owner>/<project>`` in."""
    from jupyterhub import orm

    token = orm.APIToken.find(db, spawner.api_token) if spawner.api_token else None
    if token is None:
        return
    owner = spawner.user.name
    own = f"{SCOPE}!server={owner}/{spawner.name}"
    whole = {SCOPE, f"{SCOPE}!user", f"{SCOPE}!user={owner}"}
    scopes = [s for s in token.scopes if s not in whole]
    if own not in scopes:
        scopes.append(own)
    if scopes != list(token.scopes):
        token.scopes = scopes
        db.commit()


def servers_allowed(parsed_scopes: dict, user_name: str) -> set[str] | None:
    """The servers of ``user_name`` whose activity a token with ``parsed_scopes`` may
    report: None where it may report the user's activity as a whole (JupyterHub's own
    check applies), else a set of server names (empty: none)."""
    filters = parsed_scopes.get(SCOPE)
    if filters is None:
        return set()
    if filters == Scope.ALL or user_name in filters.get("user", ()):
        return None
    prefix = user_name + "/"
    return {s.removeprefix(prefix) for s in filters.get("server", ()) if s.startswith(prefix)}


class ServerActivityHandler(ActivityAPIHandler):
    """JupyterHub's activity API, where a token limited to servers reports those only."""

    def post(self, user_name):
        if not self.current_user:
            return super().post(user_name)  # JupyterHub's answer: 403
        allowed = servers_allowed(self.parsed_scopes, user_name)
        if allowed is None or not allowed or self.has_scope(f"{SCOPE}!user={user_name}"):
            # the whole user (a group's filter included), or no access at all: JupyterHub's
            # own check and answer (404 where the token holds the scope for others only)
            return super().post(user_name)
        body = self.get_json_body()
        servers = body.get("servers") if isinstance(body, dict) else None
        if not isinstance(servers, dict) or not servers:
            raise web.HTTPError(
                403,
                "This token may report the activity of its own server only: name it in 'servers'.",
            )
        others = sorted(str(name) for name in servers if name not in allowed)
        if others:
            raise web.HTTPError(
                403,
                f"This token may report the activity of {', '.join(sorted(allowed))} only, "
                f"not of {', '.join(others)}.",
            )
        # JupyterHub's own update (checks, timestamps, the user's last activity), past
        # its scope check on the whole user, which this token does not pass.
        return ActivityAPIHandler.post.__wrapped__(self, user_name)


def hub_handlers() -> list[tuple[str, type]]:
    """The route, for the authenticator's list (before JupyterHub's own)."""
    return [(ROUTE, ServerActivityHandler)]
