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

import ipaddress
import os
import re
import sys
from pathlib import Path
from urllib.parse import urlsplit

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
_HOSTNAME = re.compile(r"(?=.{1,253}\Z)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")  # fmt: skip


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


def port_of(s: dict[str, str]) -> int:
    """GPULAB_SSH_PORT as a number: 0 (no gateway) or 1..65535; ValueError otherwise."""
    text = s.get("GPULAB_SSH_PORT", "")
    if not re.fullmatch(r"[0-9]{1,5}", text) or int(text) > 65535:
        raise ValueError(
            f"GPULAB_SSH_PORT must be a port number from 1 to 65535, or 0 for no SSH "
            f"gateway; it is {text!r}."
        )
    return int(text)


def valid_host(text: str) -> bool:
    """An IP address or a host name, whole."""
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return _HOSTNAME.fullmatch(text) is not None


def bind_of(s: dict[str, str]) -> str:
    """The gateway's address: GPULAB_SSH_BIND, else the host of GPULAB_BIND_URL."""
    bind = s.get("GPULAB_SSH_BIND", "")
    if not bind:
        bind = urlsplit(s.get("GPULAB_BIND_URL", "")).hostname or "0.0.0.0"
    if not valid_host(bind):
        raise ValueError(f"GPULAB_SSH_BIND must be an IP address or a host name; it is {bind!r}.")
    return bind


def service_env(s: dict[str, str], hub_dir: str | Path, environ=None) -> dict[str, str]:
    """The gateway process's environment (besides JupyterHub's own variables)."""
    from gpulab_hub.ssh.limits import Limits

    environ = os.environ if environ is None else environ
    where = paths(hub_dir)
    env = {
        "GPULAB_SSH_BIND": bind_of(s),
        "GPULAB_SSH_PORT": str(port_of(s)),
        "GPULAB_SSH_HOST_KEY": str(where["host_key"]),
        "GPULAB_SSH_KEYS_DIR": str(where["keys_dir"]),
        "GPULAB_SSH_LOG": str(where["log"]),
        "GPULAB_CONTAINER_PREFIX": s["GPULAB_CONTAINER_PREFIX"],
        # The hub's login rules hold for tokens given as SSH passwords (ssh/limits.py).
        "GPULAB_LOGIN_ATTEMPTS": s["GPULAB_LOGIN_ATTEMPTS"],
        "GPULAB_LOGIN_LOCKOUT_SECONDS": s["GPULAB_LOGIN_LOCKOUT_SECONDS"],
        # Open sessions are checked twice within the revocation window.
        "GPULAB_REVOKE_WITHIN_S": s.get("GPULAB_REVOKE_WITHIN_S", "30"),
    }
    # The address lockout, where the site sets it (else the gateway's defaults).
    for key in ("GPULAB_SSH_IP_ATTEMPTS", "GPULAB_SSH_FAILURE_WINDOW"):
        if s.get(key):
            env[key] = s[key]
    Limits.from_env(env)  # a setting out of range stops the hub's start, naming it
    env.update({k: environ[k] for k in DOCKER_ENV if environ.get(k)})
    return env


def _listed(c, section: str, name: str) -> list:
    config = getattr(c, section)
    value = config[name] if name in config else []
    return list(value) if isinstance(value, list | tuple) else []


def configure(c, s: dict[str, str], hub_dir) -> None:
    """The gateway service and its role (unless GPULAB_SSH_PORT is 0), the SSH page
    (always: with the gateway off it says so) and the access API."""
    port = port_of(s)
    where = paths(hub_dir)
    page = {
        "keys_dir": str(where["keys_dir"]),
        "host_key": str(where["host_key"]),
        "port": port,
        "public_url": s.get("GPULAB_PUBLIC_URL", ""),
    }
    c.JupyterHub.extra_handlers = [
        *_listed(c, "JupyterHub", "extra_handlers"),
        (PAGE, "gpulab_hub.ssh.web.SSHPageHandler", page),
        (API + r"/([^/]+)/([^/]+)/([^/]+)", "gpulab_hub.ssh.hubapi.AccessHandler"),
    ]
    c.JupyterHub.template_paths = [*_listed(c, "JupyterHub", "template_paths"), str(TEMPLATES)]
    if not port:
        return
    env = service_env(s, hub_dir)
    c.JupyterHub.services = [
        *_listed(c, "JupyterHub", "services"),
        {"name": SERVICE, "command": [sys.executable, "-m", "gpulab_hub.ssh"], "environment": env},
    ]
    c.JupyterHub.load_roles = [
        *_listed(c, "JupyterHub", "load_roles"),
        {"name": SERVICE, "scopes": SCOPES, "services": [SERVICE]},
    ]
    scopes = c.JupyterHub.custom_scopes if "custom_scopes" in c.JupyterHub else {}
    c.JupyterHub.custom_scopes = {**dict(scopes), **CUSTOM_SCOPES}
