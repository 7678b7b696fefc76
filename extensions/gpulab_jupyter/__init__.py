"""gpulab's user side: installed into every project image.

This distribution holds what runs inside a project's container: the Jupyter
server extension under ``/api/gpulab/v1/``. Nothing happens at import time;
handlers are registered when Jupyter Server loads the extension.
"""

__version__ = "0.1.0"


def _jupyter_server_extension_points():
    return [{"module": "gpulab_jupyter"}]


def _load_jupyter_server_extension(serverapp):
    from .handlers import setup_handlers

    setup_handlers(serverapp.web_app)
    serverapp.log.info("gpulab_jupyter %s loaded", __version__)
