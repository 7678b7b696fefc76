# gpulab's JupyterHub configuration: wires gpulab's classes and reads the site
# settings (GPULAB_* environment variables, see docs/configuration.md).
# Add your own `c.ProjectSpawner.* = ...` lines below; each trait's help says how.
import os
from pathlib import Path

from gpulab_hub import hubfiles, settings

c = get_config()  # noqa: F821 (provided by JupyterHub)
# The hub folder is private: umask 077 for what the hub makes, older files fixed.
hubfiles.start_private(settings.paths(settings.site(os.environ)["GPULAB_HOME"])["hub"])
images = Path(__file__).resolve().parent / "images"
settings.apply(c, settings.with_hub_ip(os.environ), images_dir=images)
