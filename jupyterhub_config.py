# gpulab's JupyterHub configuration: wires gpulab's classes and reads the site
# settings (GPULAB_* environment variables, see docs/configuration.md).
# Add your own `c.ProjectSpawner.* = ...` lines below; each trait's help says how.
import os
from pathlib import Path

from gpulab_hub import settings

c = get_config()  # noqa: F821 (provided by JupyterHub)
settings.apply(c, os.environ, images_dir=Path(__file__).resolve().parent / "images")
