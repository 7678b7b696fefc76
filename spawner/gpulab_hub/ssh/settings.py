"""The SSH gateway's settings, read once from the environment the hub gives the
service (ssh/__init__.py's service_env, JupyterHub's own variables)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpulab_hub.ssh.limits import Limits


def _revoke_within(text: str, default: int) -> int:
    """GPULAB_REVOKE_WITHIN_S as the hub gives it (2..3600), else ``default``."""
    return int(text) if text.isdigit() and 2 <= int(text) <= 3600 else default


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
    recheck_s: float = 15.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """The service's settings (ssh/__init__.py's service_env, JupyterHub's own
        variables); ValueError names what is missing or wrong."""
        from gpulab_hub.sharing import REVOKE_WITHIN_S

        missing = [
            name
            for name in (
                "GPULAB_SSH_PORT",
                "GPULAB_SSH_HOST_KEY",
                "GPULAB_SSH_KEYS_DIR",
                "JUPYTERHUB_API_URL",
                "JUPYTERHUB_API_TOKEN",
            )
            if not env.get(name)
        ]
        if missing:
            raise ValueError(f"the SSH gateway needs {', '.join(missing)} (the hub sets them)")
        port = env["GPULAB_SSH_PORT"]
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"GPULAB_SSH_PORT must be a port number, not {port!r}")
        return cls(
            bind=env.get("GPULAB_SSH_BIND") or "127.0.0.1",
            port=int(port),
            host_key=Path(env["GPULAB_SSH_HOST_KEY"]),
            keys_dir=Path(env["GPULAB_SSH_KEYS_DIR"]),
            log=env.get("GPULAB_SSH_LOG", ""),
            prefix=env.get("GPULAB_CONTAINER_PREFIX") or "gpulab",
            api_url=env["JUPYTERHUB_API_URL"],
            api_token=env["JUPYTERHUB_API_TOKEN"],
            limits=Limits.from_env(env),
            # twice in the window in which a revoked share ends open connections
            recheck_s=_revoke_within(env.get("GPULAB_REVOKE_WITHIN_S", ""), REVOKE_WITHIN_S) / 2,
        )
