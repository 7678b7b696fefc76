"""What the SSH gateway runs with: the hub's settings (``gpulab_hub.settings``, handed
to the service by ssh/__init__.py's service_env) and JupyterHub's own variables."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpulab_hub import settings as site
from gpulab_hub.ssh.limits import Limits


@dataclass(frozen=True)
class Settings:
    bind: str
    port: int
    host_key: Path
    keys_dir: Path
    log: str
    prefix: str
    api_url: str
    api_token: str
    limits: Limits
    recheck_s: float = site.DEFAULT.revoke_recheck_s

    @classmethod
    def of(cls, s: site.Settings, api_url: str, api_token: str) -> Settings:
        """The gateway's view of the hub's settings ``s``."""
        from gpulab_hub import ssh

        if not s.ssh.port:
            raise ValueError("GPULAB_SSH_PORT is 0: the site runs no SSH gateway")
        where = ssh.paths(s.hub_dir)
        return cls(
            bind=s.ssh_bind,
            port=s.ssh.port,
            host_key=where["host_key"],
            keys_dir=where["keys_dir"],
            log=str(where["log"]),
            prefix=s.prefix,
            api_url=api_url,
            api_token=api_token,
            limits=Limits.of(s),
            # twice in the window in which a revoked share ends open connections
            recheck_s=s.revoke_recheck_s,
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """The service's settings (its environment: the hub's settings and JupyterHub's
        API URL and token); ValueError names what is missing or wrong."""
        missing = [n for n in ("JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN") if not env.get(n)]
        if missing:
            raise ValueError(f"the SSH gateway needs {', '.join(missing)} (the hub sets them)")
        return cls.of(site.of_service(env), env["JUPYTERHUB_API_URL"], env["JUPYTERHUB_API_TOKEN"])
