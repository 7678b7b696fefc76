"""SSH into projects: a gateway the hub starts as a service (see docs/remote.md).

Contract between the hub side (keys.py, hubapi.py, web.py, configure below) and the
gateway (gateway.py, run as ``python -m gpulab_hub.ssh``):

- the gateway is the JupyterHub service ``SERVICE``; its token holds ``GATEWAY_SCOPE``
  (plus ``servers`` and ``read:servers``, to start a stopped project and follow it);
- ``GET /hub/api/gpulab/ssh/access/<user>/<owner>/<project>`` tells it what ``user``
  may do in ``owner``'s ``project`` and where the project's container is;
- each user's public keys are in ``KeyStore`` files under the hub's folder;
- ``GET /hub/api/gpulab/secrets/<owner>/<project>?for=<user>`` gives the
  environment of ``user``'s sessions (secrets/).
"""

from __future__ import annotations

SERVICE = "gpulab-ssh"
GATEWAY_SCOPE = "custom:gpulab:ssh-gateway"


def configure(c, s: dict[str, str], hub_dir) -> None:
    """The gateway service, its role, its pages and settings (filled in by ssh/)."""
