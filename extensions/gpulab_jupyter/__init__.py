"""gpulab's user side: installed into every project image, or into any JupyterLab 4.

This distribution holds what runs inside a project's container: the Jupyter
server extension under ``/api/gpulab/v1/`` (GPU status of this container) and
the JupyterLab extension that shows it (status bar item and panel). Nothing
happens at import time: the server extension is set up when Jupyter Server
loads it, and NVML is only started on the sampler's thread.
"""

__version__ = "0.1.0"


def _jupyter_labextension_paths():
    return [{"src": "labextension", "dest": "gpulab-jupyter"}]


def _jupyter_server_extension_points():
    from .app import GPULabExtension

    return [{"module": "gpulab_jupyter", "app": GPULabExtension}]


def load_ipython_extension(ipython):
    """``%load_ext gpulab_jupyter`` loads the magics, as ``%load_ext gpulab_jupyter.magics``."""
    from .magics import load_ipython_extension as load

    load(ipython)
