"""The Jupyter Server extension: GPU status routes and the one sampler they share;
under gpulab's hub (``ProjectAuthorizer``), the guards of the viewer role."""

from jupyter_server.extension.application import ExtensionApp

from .handlers import routes
from .sampler import GPUSampler


class GPULabExtension(ExtensionApp):
    """gpulab's user side in a Jupyter server (``c.GPUSampler.*`` configures the sampler)."""

    name = "gpulab_jupyter"
    description = "gpulab: the GPU status of this project's container"
    load_other_extensions = True

    def initialize_settings(self):
        self.sampler = GPUSampler(parent=self)
        self.settings["gpulab_sampler"] = self.sampler
        self.sampler.start()  # NVML starts on the sampler's thread, not here

    def initialize_handlers(self):
        self.handlers.extend(routes())
        if uses_project_authorizer(self.serverapp):
            # Extensions loaded after this one add their routes later: each addition
            # is guarded as it is made, before the server handles any request.
            web_app = self.serverapp.web_app
            add_handlers = web_app.add_handlers

            def add_guarded_handlers(host_pattern, host_handlers):
                add_handlers(host_pattern, host_handlers)
                self.guard_routes()

            web_app.add_handlers = add_guarded_handlers
            self.guard_routes()

    def guard_routes(self):
        """Routes that never ask the authorizer ask it for writes; real-time
        collaboration rooms are read-only for viewers (see authorizer.py, collab.py)."""
        from .authorizer import all_rules, guard_routes
        from .collab import guard_rooms

        try:
            rules = all_rules(self.serverapp.web_app)
            guarded = guard_routes(rules)
            rooms = guard_rooms(rules)
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


def uses_project_authorizer(serverapp) -> bool:
    """Whether the server's authorizer is gpulab's (never imported otherwise: a plain
    JupyterLab may have no jupyterhub)."""
    authorizer = getattr(serverapp, "authorizer", None)
    return any(cls.__module__ == "gpulab_jupyter.authorizer" for cls in type(authorizer).__mro__)
