"""SSH into projects: a gateway the hub starts as a service (see docs/remote.md).

Contract between the hub side (keys.py, hubapi.py, web.py, configure below) and the
gateway (gateway.py, run as ``python -m gpulab_hub.ssh``):

- the gateway is the JupyterHub service ``SERVICE``; its token holds ``GATEWAY_SCOPE``
  (plus ``servers`` and ``read:servers``, to start a stopped project and follow it);
- ``GET /hub/api/gpulab/ssh/access/<user>/<owner>/<project>`` tells it what ``user``
  may do in ``owner``'s ``project`` and where the project's container is;
- each user's public keys are in ``KeyStore`` files under the hub's folder;
- ``GET /hub/api/gpulab/secrets/<owner>/<project>?for=<user>`` gives the
  environment of ``user``'s sessions (secrets/);
- while a session or forward is open in a project, the gateway marks the project's
  server active (JupyterHub's ``POST /users/<owner>/activity``, ``users:activity``) at
  most every ``ACTIVITY_EVERY_S``, so an SSH session counts as use for the idle culler
  and the GPU keeper (gpus/keeper.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpulab_hub.settings import Settings

SERVICE = "gpulab-ssh"
ACTIVITY_EVERY_S = 30.0  # an open session marks its project active this often at most
GATEWAY_SCOPE = "custom:gpulab:ssh-gateway"
TEMPLATES = Path(__file__).with_name("templates")
PAGE = "/gpulab/ssh"  # under the hub's prefix: /hub/gpulab/ssh
API = "/api/gpulab/ssh/access"  # /hub/api/gpulab/ssh/access/<user>/<owner>/<project>
# What the gateway's token may do: ask the access API, start a stopped project and
# follow it, read users' names, and mark a project active while an SSH session is open
# in it (its last_activity, what the idle culler and the GPU keeper read)
# (c.JupyterHub.load_roles).
SCOPES = [GATEWAY_SCOPE, "servers", "read:servers", "read:users:name", "users:activity"]
CUSTOM_SCOPES = {
    GATEWAY_SCOPE: {
        "description": "gpulab's SSH gateway: ask who may open a shell in which project"
    }
}
# The Docker client settings the gateway needs from the hub's environment (JupyterHub
# starts services with few of its variables).
DOCKER_ENV = ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH")


def paths(hub_dir: str | Path) -> dict[str, Path]:
    """Where the gateway keeps things, in the hub's private folder: its host key (the
    public half beside it, ``.pub``), users' public keys (keys.KeyStore), its log."""
    ssh_dir = Path(hub_dir) / "ssh"
    return {
        "dir": ssh_dir,
        "host_key": ssh_dir / "host_ed25519_key",
        "keys_dir": ssh_dir / "keys",
        "log": ssh_dir / "sessions.log",
    }


def access_url(hub_api_url: str, user: str, owner: str, project: str) -> str:
    """The access API's URL for ``user`` logging in to ``owner``'s ``project``, from the
    hub's API URL (JUPYTERHUB_API_URL, ".../hub/api")."""
    from urllib.parse import quote

    parts = "/".join(quote(p, safe="") for p in (user, owner, project))
    return f"{hub_api_url.rstrip('/')}{API.removeprefix('/api')}/{parts}"


def service_env(s: Settings, environ=None) -> dict[str, str]:
    """The gateway process's environment (besides JupyterHub's own variables): the
    hub's settings (settings.service_env, read back by ssh/settings.py) and the Docker
    client's variables."""
    from gpulab_hub import settings

    environ = os.environ if environ is None else environ
    env = settings.service_env(s)
    env.update({k: environ[k] for k in DOCKER_ENV if environ.get(k)})
    # The loop guard as the hub has it (tests make it strict): blocking.py
    env.update({k: environ[k] for k in ("GPULAB_LOOP_GUARD",) if environ.get(k)})
    return env


def _listed(c, section: str, name: str) -> list:
    config = getattr(c, section)
    value = config[name] if name in config else []
    return list(value) if isinstance(value, list | tuple) else []


def configure(c, s: Settings) -> None:
    """The SSH page (always: with the gateway off it says so) and the access API; the
    gateway service itself comes with the complete settings (configure_service)."""
    where = paths(s.hub_dir)
    page = {
        "keys_dir": str(where["keys_dir"]),
        "host_key": str(where["host_key"]),
        "port": s.ssh.port,
        "public_url": s.public_url,
    }
    c.JupyterHub.extra_handlers = [
        *_listed(c, "JupyterHub", "extra_handlers"),
        (PAGE, "gpulab_hub.ssh.web.SSHPageHandler", page),
        (API + r"/([^/]+)/([^/]+)/([^/]+)", "gpulab_hub.ssh.hubapi.AccessHandler"),
    ]
    c.JupyterHub.template_paths = [*_listed(c, "JupyterHub", "template_paths"), str(TEMPLATES)]


def configure_service(c, s: Settings) -> None:
    """The gateway service, its role and scope (unless GPULAB_SSH_PORT is 0), given the
    settings ``s``; called again, it replaces its own entries in place."""
    if not s.ssh.port:
        return
    service = {
        "name": SERVICE,
        "command": [sys.executable, "-m", "gpulab_hub.ssh"],
        "environment": service_env(s),
    }
    role = {"name": SERVICE, "scopes": SCOPES, "services": [SERVICE]}
    c.JupyterHub.services = _put(_listed(c, "JupyterHub", "services"), service)
    c.JupyterHub.load_roles = _put(_listed(c, "JupyterHub", "load_roles"), role)
    scopes = c.JupyterHub.custom_scopes if "custom_scopes" in c.JupyterHub else {}
    c.JupyterHub.custom_scopes = {**dict(scopes), **CUSTOM_SCOPES}


def _put(entries: list, entry: dict) -> list:
    """``entries`` with ``entry`` in place of the one of its name (else at the end)."""
    names = [e.get("name") for e in entries]
    if entry["name"] in names:
        i = names.index(entry["name"])
        return [*entries[:i], entry, *entries[i + 1 :]]
    return [*entries, entry]
