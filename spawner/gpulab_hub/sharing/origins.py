"""Browser origins: each user's servers on an origin of their own, and a strict CSP on
the hub's pages (docs/deployment.md, "Origins").

Without ``GPULAB_SUBDOMAIN_HOST`` every project server is served under the hub's own
host (``/user/<owner>/<project>/``): a page in someone's project (an HTML file, a
notebook's output) then runs with the hub session of whoever opens it, and can call
the hub's API as them. That is the local default (``make up`` on 127.0.0.1, one
person); wherever other people can reach the hub, set ``GPULAB_SUBDOMAIN_HOST`` (for
example ``https://lab.example.org``): JupyterHub's ``subdomain_host`` then serves
each user's servers from ``<user>.lab.example.org`` (JupyterHub 6 puts all named
servers of a user on that user's subdomain, ``subdomain_hook = "idna"``), a
different origin from the hub's, whose cookies it never gets.

The hub's pages carry :func:`hub_csp` (through ``tornado_settings['headers']``):
scripts, styles, images, fonts and connections from the hub's own origin only, no
plugins, no ``<base>`` elsewhere, no framing (the share page embedded in JupyterLab
allows the project owner's origin only), forms that post to the hub (and, with
subdomains, redirect on to a user's server after logging in or authorizing).
JupyterHub's own templates carry inline scripts (``window.jhdata``, per request),
so scripts need ``'unsafe-inline'``: the policy stops loading and sending anything
elsewhere, not inline injection, which JupyterHub's templates escape.
"""

from __future__ import annotations

from urllib.parse import urlparse

CSP_HEADER = "Content-Security-Policy"


def subdomain_sources(subdomain_host: str) -> str:
    """CSP source of every user's origin under ``subdomain_host`` ('' if none)."""
    if not subdomain_host:
        return ""
    url = urlparse(subdomain_host)
    port = f":{url.port}" if url.port else ""
    return f"{url.scheme}://*.{url.hostname}{port}"


def hub_csp(subdomain_host: str = "", base_url: str = "/") -> str:
    """The Content-Security-Policy of the hub's pages."""
    users = subdomain_sources(subdomain_host)
    forms = f"'self' {users}".strip()
    base = "/" + base_url.strip("/") + "/" if base_url.strip("/") else "/"
    return "; ".join(
        [
            "default-src 'self'",
            "script-src 'self' 'unsafe-inline'",
            "style-src 'self' 'unsafe-inline'",
            "img-src 'self' data:",
            "font-src 'self' data:",
            "connect-src 'self'",
            "object-src 'none'",
            "base-uri 'self'",
            f"form-action {forms}",
            "frame-ancestors 'none'",
            f"report-uri {base}hub/security/csp-report",
        ]
    )


def framed_by(csp: str, *sources: str) -> str:
    """``csp`` with its frame-ancestors replaced by ``sources``."""
    kept = [d.strip() for d in csp.split(";") if not d.strip().startswith("frame-ancestors")]
    allowed = " ".join(s for s in sources if s) or "'none'"
    return "; ".join([*kept, f"frame-ancestors {allowed}"])


def configured_csp(handler) -> str:
    """The hub pages' CSP as configured (``tornado_settings['headers']``), else
    JupyterHub's own default (for a handler whose page changes it)."""
    from jupyterhub.handlers.base import BaseHandler

    headers = handler.settings.get("headers") or {}
    for name, value in headers.items():
        if name.lower() == CSP_HEADER.lower():
            return value
    return BaseHandler.content_security_policy.fget(handler)


def apply(c, subdomain_host: str, base_url: str = "/") -> None:
    """Set ``c``'s subdomains (if any) and the hub pages' CSP."""
    if subdomain_host:
        c.JupyterHub.subdomain_host = subdomain_host
    c.JupyterHub.tornado_settings.update(
        {"headers": {CSP_HEADER: hub_csp(subdomain_host, base_url)}}
    )
