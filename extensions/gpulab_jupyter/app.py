"""The Jupyter Server extension: GPU status routes and the one sampler they share."""

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

    async def stop_extension(self):
        self.sampler.stop()
