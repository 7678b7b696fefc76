"""/hub/spawn/<user>/<project>: a GET shows, only a POST makes or starts a project.

JupyterHub 6.1's spawn page starts a server on GET: at once where the spawner has no
options form (gpulab on a host without GPUs, or a project whose last build was good),
and with the options of the query (``?opt-gpus=4``) in every case. A GET of an unknown
name also made the server (a project that then shows on the home page). So a plain
link or image on any site the user opened made and started projects in their name,
holding GPUs. Here a GET changes nothing:

- a project of that name that runs or is starting: on to it, or to its progress
  (JupyterHub's own redirects);
- one that is stopped: the spawn form (projects/templates/spawn.html, fields from
  projects/options.py, empty where there is no choice), whose button POSTs with
  JupyterHub's XSRF token to JupyterHub's own POST, which starts it; the query's options
  are ignored;
- a name with no project: nothing is made; the user's own name goes home, which says
  there is no such project and offers to create one; another user's, 404.
"""

from __future__ import annotations

from jupyterhub.handlers.pages import SpawnHandler
from jupyterhub.scopes import needs_scope
from tornado import web

from gpulab_hub.home import web as home_web


class SpawnPageHandler(SpawnHandler):
    """JupyterHub's spawn page, whose GET shows the form and never spawns (module doc);
    POST is JupyterHub's (XSRF checked by its BaseHandler)."""

    @needs_scope("servers")
    async def _get(self, user_name, server_name, display_name):
        user = self.current_user
        if user_name != user.name:
            user = self.find_user(user_name)
            if user is None:
                raise web.HTTPError(404, f"No such user: {user_name}")
        if server_name not in user.orm_user.orm_spawners:
            if user is self.current_user:
                self.redirect(home_web.home_url(self, missing=server_name))
                return
            raise web.HTTPError(404, f"{user.name} has no project {server_name}.")
        await self._check_named_server_request(user, server_name, display_name)
        spawner = user.spawners[server_name]  # it exists: nothing is made
        if spawner.ready:
            self.redirect(self.get_next_url(user, default=user.server_url(server_name)))
            return
        if spawner.active:
            self.redirect(self._get_pending_url(user, server_name))
            return
        spawner.handler = self
        await spawner.run_auth_state_hook(await user.get_auth_state())
        form = await spawner.get_options_form()
        html = await self.render_template(
            "spawn.html",
            for_user=user,
            auth_state=None,
            spawner_options_form=form or "",
            error_message="",
            html_error_message="",
            url=self._form_action(),
            spawner=spawner,
        )
        self.finish(html)

    def _form_action(self) -> str:
        """This page's address with JupyterHub's XSRF token, without its query's spawn
        options (the POST reads the form's fields only; ``next`` is kept)."""
        from tornado.httputil import url_concat

        query = {"_xsrf": self.xsrf_token.decode("ascii")}
        after = self.get_query_argument("next", "")
        if after:
            query["next"] = after
        return url_concat(self.request.path, query)
