"""The Jupyter Server extension: GPU status routes and the one sampler they share,
the jobs routes and their engine, activity from jobs and GPUs for the idle culler;
under gpulab's hub (``ProjectAuthorizer``), the guards of the viewer role and the
secrets of who starts a terminal (secrets/)."""

from jupyter_server.extension.application import ExtensionApp

from .handlers import routes
from .sampler import GPUSampler


class GPULabExtension(ExtensionApp):
    """gpulab's user side in a Jupyter server (``c.GPUSampler.*`` configures the sampler)."""

    name = "gpulab_jupyter"
    description = "gpulab: the GPU status of this project's container"
    load_other_extensions = True

    def _link_jupyter_server_extension(self, serverapp):
        super()._link_jupyter_server_extension(serverapp)
        from .contents import choose

        choose(serverapp, self.log)  # before the server makes its file manager

    def initialize_settings(self):
        from .activity import ActivityReporter
        from .jobs.cli import project_dir
        from .jobs.cluster import engine_for

        self.sampler = GPUSampler(parent=self)
        self.settings["gpulab_sampler"] = self.sampler
        self.sampler.start()  # NVML starts on the sampler's thread, not here
        self.jobs = engine_for(project_dir())  # the cluster's where the spawner says so
        self.settings["gpulab_jobs"] = self.jobs
        self.activity = ActivityReporter(
            self.serverapp.web_app.settings, self.jobs, self.sampler, parent=self
        )
        self.activity.start()

    def initialize_handlers(self):
        from .hubpeers import only_hub_peers

        only_hub_peers(self.serverapp.web_app, log=self.log)  # on a cluster: the hub only
        self.handlers.extend(routes())
        from .cells import install as cells_on_server

        if cells_on_server(self):
            self.log.info("gpulab: cells run on the server's side (jupyter-server-nbmodel)")
        if uses_project_authorizer(self.serverapp):
            # Extensions loaded after this one add their routes later: each addition
            # is guarded as it is made, before the server handles any request.
            web_app = self.serverapp.web_app
            add_handlers = web_app.add_handlers

            def add_guarded_handlers(host_pattern, host_handlers):
                add_handlers(host_pattern, host_handlers)
                self.guard_routes()
                self.deliver_secrets()

            web_app.add_handlers = add_guarded_handlers
            adapt_identity_provider(self.serverapp)
            # Someone whose access ended is told so, with a way back (revoked.py).
            from .revoked import install as install_403_page

            install_403_page(web_app.settings)
            self.guard_routes()
            self.deliver_secrets()

    def deliver_secrets(self):
        """New terminals get the secrets of who opens them (the terminals extension makes
        its manager after this one loads; kernels: secrets/kernels.py)."""
        from .secrets.terminals import deliver_to_terminals

        if deliver_to_terminals(self.serverapp.web_app.settings):
            self.log.info("gpulab: new terminals get the secrets of who opens them")

    def guard_routes(self):
        """Routes that never ask the authorizer ask it for writes; real-time
        collaboration rooms are read-only for viewers (see authorizer.py, collab.py);
        each visitor opens their own JupyterLab layout (workspaces.py)."""
        from .authorizer import all_rules, guard_routes, mend_licenses
        from .collab import guard_rooms
        from .workspaces import own_layouts

        try:
            # JupyterLab puts the server's token into its page settings when it adds
            # its routes (pages take the visitor's own token instead).
            page_config = self.serverapp.web_app.settings.get("page_config_data") or {}
            if page_config.get("token"):
                page_config["token"] = ""
            rules = all_rules(self.serverapp.web_app)
            guarded = guard_routes(rules)
            mend_licenses(rules)
            rooms = guard_rooms(rules)
            own_layouts(rules)  # each visitor their own JupyterLab layout (workspaces.py)
        except Exception:
            # Never serve viewers unguarded routes: stop the server instead.
            self.log.exception("gpulab: could not guard the server's routes; stopping")
            self.serverapp.stop()
            raise
        for name in guarded:
            self.log.info("gpulab: %s asks the authorizer now", name)
        if rooms:
            self.log.info("gpulab: collaboration rooms are read-only for viewers")

    async def stop_extension(self):
        self.sampler.stop()
        self.activity.stop()


def uses_project_authorizer(serverapp) -> bool:
    """Whether the server's authorizer is gpulab's (never imported otherwise: a plain
    JupyterLab may have no jupyterhub)."""
    authorizer = getattr(serverapp, "authorizer", None)
    return any(cls.__module__ == "gpulab_jupyter.authorizer" for cls in type(authorizer).__mro__)


def adapt_identity_provider(serverapp) -> None:
    """Keep the server's own token (``$JUPYTERHUB_API_TOKEN``) out of every page.

    JupyterHub's identity provider answers ``token`` with that token, and
    jupyter_server writes ``IdentityProvider.token`` into its pages (error pages
    included: ``data-jupyter-api-token``) and JupyterLab into its page settings, so
    anyone who may load a page here, a viewer too, could read it. It stays where the
    server needs it (``hub_auth.api_token``, for its requests to the hub); the
    identity provider's ``token``, which only a server that logs people in by token
    needs, says "" (JupyterHub logs them in).

    It also asks the hub again before it refuses someone on a cached answer
    (freshrefusal.py: access granted again works at once).
    """
    from .freshrefusal import FreshRefusal

    provider = serverapp.identity_provider
    cls = type(provider)
    if not getattr(cls, "gpulab_hides_token", False):
        provider.__class__ = type(
            cls.__name__,
            (FreshRefusal, cls),
            {"token": property(lambda _: ""), "gpulab_hides_token": True, "__module__": __name__},
        )
    serverapp.web_app.settings["token"] = ""
    page_config = serverapp.web_app.settings.get("page_config_data") or {}
    if page_config.get("token"):
        page_config["token"] = ""
