"""The project server's kernel manager: a new kernel gets the secrets of the person who
started it (deliver.py). gpulab's hub configures it
(``--ServerApp.kernel_manager_class=gpulab_jupyter.secrets.kernels.SecretsKernelManager``);
it is jupyter_server's default manager otherwise. A restarted kernel keeps the
environment it started with."""

from __future__ import annotations

import os

from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager

from gpulab_jupyter.secrets import deliver


class SecretsKernelManager(AsyncMappingKernelManager):
    """jupyter_server's AsyncMappingKernelManager, adding the starter's secrets."""

    async def start_kernel(self, *, kernel_id=None, path=None, **kwargs):
        delivery = deliver.current.get()
        if delivery is not None and (kernel_id is None or kernel_id not in self):
            kwargs["env"] = deliver.with_secrets(kwargs.get("env") or os.environ, delivery)
        return await super().start_kernel(kernel_id=kernel_id, path=path, **kwargs)
