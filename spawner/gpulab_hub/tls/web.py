"""Caddy's ``ask`` for on-demand certificates: a name gets one only if it is the hub's
or ``<user>.<hub>`` for a user who exists, so nobody can make Caddy ask the CA for
made-up names (and use up its limits for the domain)."""

from __future__ import annotations

from jupyterhub import orm
from jupyterhub.handlers import BaseHandler

from gpulab_hub import settings, tls


def allowed(domain: str, hub_host: str, user_exists) -> bool:
    """Whether ``domain`` is ``hub_host`` or ``<user>.<hub_host>`` of an existing user."""
    if domain == hub_host:
        return True
    label, dot, rest = domain.partition(".")
    return bool(dot) and rest == hub_host and bool(label) and user_exists(label)


class AskHandler(BaseHandler):
    """GET ?domain=<name>: 200 where Caddy may get a certificate for it, else 404."""

    def get(self):
        domain = self.get_argument("domain", "")[:256].lower()
        site = tls.site_of(settings.of_handler(self).public_url)
        ok = allowed(domain, site.host, lambda name: orm.User.find(self.db, name) is not None)
        self.set_status(200 if ok else 404)
        self.finish()
