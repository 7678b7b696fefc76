"""Each user's secrets, kept encrypted on the hub (see docs/secrets.md).

- names.py: what a secret may be called and hold;
- crypt.py: the encryption (JupyterHub's CryptKeeper) and its key;
- store.py: the tables of users' secrets (encrypted values) and projects' choices in the
  hub's database; importfile.py: the files of gpulab before its database, imported once;
- web.py: the page ``/hub/gpulab/secrets``;
- api.py: ``/hub/api/gpulab/secrets/<owner>/<project>``, which project servers (and the
  SSH gateway) ask when someone starts a kernel, a terminal or a job.

Secrets never enter a container's environment at its start, a build or an image:
one container serves the owner and the collaborators, so the project server asks for
the secrets of the person who starts each process, with that person's token, and
adds them to that process only (gpulab_jupyter.secrets).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpulab_hub.settings import Settings

TEMPLATES = Path(__file__).with_name("templates")
PAGE = "/gpulab/secrets"
API = "/api/gpulab/secrets"
# The project server's kernel manager that adds the starter's secrets to new kernels
# (installed in the project image with gpulab-jupyter).
KERNEL_MANAGER_CLASS = "gpulab_jupyter.secrets.kernels.SecretsKernelManager"


def hub_handlers() -> list[tuple]:
    """JupyterHub ``extra_handlers``: the page and the API."""
    return [
        (PAGE, "gpulab_hub.secrets.web.SecretsPageHandler"),
        (API + r"/([^/]+)/([^/]+)", "gpulab_hub.secrets.api.SecretsAPIHandler"),
    ]


def configure(c, s: Settings, hub_dir, environ=os.environ) -> None:
    """The secrets page, the API project servers ask, the encryption key, the project
    servers' kernel manager (hubconfig.apply calls this last)."""
    from gpulab_hub.secrets import crypt

    c.JupyterHub.extra_handlers = [*c.JupyterHub.extra_handlers, *hub_handlers()]
    paths = c.JupyterHub.template_paths
    c.JupyterHub.template_paths = [*(paths if isinstance(paths, list) else []), str(TEMPLATES)]
    args = c.Spawner.args
    c.Spawner.args = [
        *(args if isinstance(args, list) else []),
        f"--ServerApp.kernel_manager_class={KERNEL_MANAGER_CLASS}",
    ]
    problem = crypt.configure_keys(c, hub_dir, environ)
    if problem:
        # The hub starts all the same; the Secrets page says secrets are off, and why.
        print(f"gpulab: secrets are off: {problem}", file=sys.stderr)
