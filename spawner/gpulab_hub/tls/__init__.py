"""HTTPS in front of the hub: Debian's Caddy as a TLS reverse proxy (docs/deployment.md,
"HTTPS by default").

With ``GPULAB_PUBLIC_URL=https://<name>`` the hub starts Caddy as one of its managed
services (as the SSH gateway): Caddy answers on the public URL's port for ``<name>``
and every ``<user>.<name>`` (JupyterHub's ``subdomain_host``: each user's servers on
an origin apart from the hub's) and forwards to the hub's proxy, which listens on
127.0.0.1. Names only a LAN or this machine knows (localhost, ``*.localhost``,
``*.lan``, ``*.home.arpa``, ``*.internal``, IP addresses) get certificates from
Caddy's internal CA, whose root certificate ``gpulab up`` prints for people to
install; public names get theirs by ACME (Let's Encrypt, ZeroSSL). Caddy's data
(its CA, certificates) lives in ``$GPULAB_HOME/caddy``.
"""

from __future__ import annotations

import ipaddress
import re
import string
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from urllib.parse import urlsplit

from gpulab_hub.settings import Settings, service_env
from gpulab_hub.settingvalues import SettingError

SERVICE = "gpulab-tls"
ASK = "/gpulab/tls-ask"  # under the hub's /hub/: Caddy's ask (tls/web.py)
CADDY = "/usr/bin/caddy"  # Debian's package (scripts/setup.sh installs it)
VAR = "GPULAB_PUBLIC_URL"
# Names no public CA signs for: Caddy's internal CA serves them.
INTERNAL = re.compile(r"(?:localhost|.+\.(?:localhost|lan|home\.arpa|internal))")
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_NAME = re.compile(rf"(?=.{{1,253}}\Z){_LABEL}(?:\.{_LABEL})*")


@dataclass(frozen=True)
class Site:
    """Where people open gpulab: GPULAB_PUBLIC_URL, validated."""

    host: str  # a lower-case DNS name or an IP address
    port: int
    internal: bool  # Caddy's internal CA (else ACME)

    @property
    def address(self) -> str:
        """The host as Caddy and URLs write it (an IPv6 address in brackets)."""
        return f"[{self.host}]" if ":" in self.host else self.host

    @property
    def named(self) -> bool:
        """A DNS name (with subdomains, one per user), not an IP address."""
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            return True
        return False


def wanted(s: Settings) -> bool:
    """Whether gpulab runs Caddy: GPULAB_PUBLIC_URL is https (an admin whose own TLS proxy
    is in front sets GPULAB_SUBDOMAIN_HOST instead)."""
    return s.public_url.lower().startswith("https://")


def site_of(public_url: str) -> Site:
    """The site of ``public_url`` (https://<name>[:port][/]); SettingError in words."""
    bad = SettingError(
        f"{VAR} must be https://<name> or https://<name>:<port> (a host name or an IP "
        f"address, no path); it is {public_url!r}."
    )
    try:
        url = urlsplit(public_url)
        port = url.port or 443
    except ValueError:
        raise bad from None
    host = (url.hostname or "").lower()
    if (
        url.scheme.lower() != "https"
        or url.username is not None
        or url.password is not None
        or url.path not in ("", "/")
        or url.query
        or url.fragment
        or not host
    ):
        raise bad
    try:
        ipaddress.ip_address(host)
        return Site(host, port, internal=True)
    except ValueError:
        pass
    if not _NAME.fullmatch(host):
        raise bad
    return Site(host, port, internal=INTERNAL.fullmatch(host) is not None)


def upstream(bind_url: str) -> str:
    """The hub's proxy as Caddy reaches it (0.0.0.0 -> 127.0.0.1)."""
    url = urlsplit(bind_url)
    host = url.hostname or "127.0.0.1"
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"{f'[{host}]' if ':' in host else host}:{url.port or 80}"


def data_dir(s: Settings) -> Path:
    """Caddy's own folder: its CA, certificates and Caddyfile."""
    return s.home / "caddy"


def caddyfile(s: Settings) -> Path:
    return data_dir(s) / "Caddyfile"


def root_certificate(s: Settings) -> Path:
    """The internal CA's root certificate (Caddy writes it at its first start)."""
    return data_dir(s) / "data" / "caddy" / "pki" / "authorities" / "local" / "root.crt"


def caddy_env(s: Settings) -> dict[str, str]:
    """Caddy's environment: its data and config under GPULAB_HOME/caddy."""
    d = data_dir(s)
    return {"HOME": str(d), "XDG_DATA_HOME": str(d / "data"), "XDG_CONFIG_HOME": str(d / "config")}


def render(s: Settings) -> str:
    """The Caddyfile for these settings (from Caddyfile.template)."""
    site = site_of(s.public_url)
    template = resources.files(__package__).joinpath("Caddyfile.template").read_text()
    loopback = site.host == "localhost" or site.host.endswith(".localhost")
    named = site.named
    hub = f"https://{site.address}:{site.port}"
    return string.Template(template).substitute(
        # a name has subdomains, one per user; an address has none (and a browser sends
        # no name (SNI) for it, so its certificate is made as Caddy starts, not on demand)
        sites=f"{hub}, https://*.{site.address}:{site.port}" if named else hub,
        on_demand=(
            "# a certificate for each name as a browser first asks for it: the hub's and\n"
            "\t\t# each user's subdomain (no wildcard certificate needed)\n\t\ton_demand"
        )
        if named
        else "# the address's certificate, made as Caddy starts",
        upstream=upstream(s.bind_url),
        ask=ASK,
        issuer="issuer internal" if site.internal else "# ACME (the default issuers)",
        # ports 80 and 443: Caddy redirects http:// to https:// (and answers ACME's
        # HTTP challenge); on another port there is nothing to redirect
        redirects="" if site.port == 443 else "auto_https disable_redirects",
        # a *.localhost name is this machine's alone: nobody else is let in
        bind="bind 127.0.0.1 [::1]" if loopback else "",
    )


def hub_handlers(s: Settings) -> list[tuple]:
    """JupyterHub ``extra_handlers``: Caddy's ``ask`` (tls/web.py), where Caddy runs."""
    return [(ASK, "gpulab_hub.tls.web.AskHandler", {})] if wanted(s) else []


def configure_service(c, s: Settings) -> None:
    """Caddy as a managed service of the hub (unless :func:`wanted` says no); called
    again, it replaces its own entry in place."""
    if not wanted(s):
        return
    site_of(s.public_url)  # a bad URL stops the hub's start, in words
    service = {
        "name": SERVICE,
        "command": [sys.executable, "-m", "gpulab_hub.tls"],
        "environment": service_env(s),
    }
    given = c.JupyterHub.services if "services" in c.JupyterHub else []
    others = [e for e in given if e.get("name") != SERVICE]
    c.JupyterHub.services = [*others, service]
