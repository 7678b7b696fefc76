"""The project server's kernel manager: a new kernel gets the secrets of the person who
started it (deliver.py), and a kernel someone restarts gets that person's secrets as
they are now (what the Secrets page tells users: "restart running kernels to use
them"). gpulab's hub configures it
(``--ServerApp.kernel_manager_class=gpulab_jupyter.secrets.kernels.SecretsKernelManager``);
it is jupyter_server's default manager otherwise. A kernel that restarts by itself
(after a crash) keeps the environment it had."""

from __future__ import annotations

import os

from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager

from gpulab_jupyter.secrets import NAMES_VAR, deliver


class SecretsKernelManager(AsyncMappingKernelManager):
    """jupyter_server's AsyncMappingKernelManager, adding the starter's secrets."""

    async def start_kernel(self, *, kernel_id=None, path=None, **kwargs):
        delivery = deliver.current.get()
        if delivery is not None and (kernel_id is None or kernel_id not in self):
            kwargs["env"] = deliver.with_secrets(kwargs.get("env") or os.environ, delivery)
        return await super().start_kernel(kernel_id=kernel_id, path=path, **kwargs)

    async def restart_kernel(self, kernel_id, now=False):
        delivery = deliver.current.get()
        if delivery is not None and kernel_id in self:
            self._renew_secrets(kernel_id, delivery)
        return await super().restart_kernel(kernel_id, now=now)

    def _renew_secrets(self, kernel_id: str, delivery: deliver.Delivery) -> None:
        """The environment the kernel restarts with (jupyter_client keeps the arguments
        of its start in ``_launch_args``): the secrets it got taken out, the
        restarter's put in."""
        launch = getattr(self.get_kernel(kernel_id), "_launch_args", None)
        if not isinstance(launch, dict):
            return
        env = launch.get("env")
        env = dict(env) if isinstance(env, dict) else dict(os.environ)
        for name in (env.get(NAMES_VAR) or "").split(","):
            if name:
                env.pop(name, None)
        launch["env"] = deliver.with_secrets(env, delivery)
