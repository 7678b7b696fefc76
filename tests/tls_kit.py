"""What the HTTPS tests share: a hub user and a Chromium profile trusting the CA
`gpulab up` told people to install (tests/test_tls_caddy.py, tests/test_tls_lan.py)."""

from __future__ import annotations

import subprocess

import pytest
import requests
from conftest import hub_env, start_hub
from hubclient import HubUser

from gpulab_hub import settings, tls


def ca_of(hub) -> str:
    """The root certificate `gpulab up` told people to install."""
    said = " ".join(hub.up_output.split())
    root = str(tls.root_certificate(settings.parse(hub.env)))
    assert "Install its root certificate on each laptop and phone" in said
    assert root in said
    return root


class TlsUser(HubUser):
    """A hub user whose every request trusts ``ca`` (and only it)."""

    def __init__(self, base_url: str, name: str, password: str, ca: str):
        super().__init__(base_url, name, password)
        self.http.verify = ca
        self.http.trust_env = False  # else REQUESTS_CA_BUNDLE would win over verify

    def api(self, method: str, path: str, **kw) -> requests.Response:
        headers = {**kw.pop("headers", {}), "Authorization": f"token {self.token}"}
        kw.setdefault("timeout", 30)
        return self.http.request(method, f"{self.base}{path}", headers=headers, **kw)


def nss_home(tmp_path, ca: str) -> str:
    """A HOME whose NSS database (Chromium's on Linux) trusts ``ca``."""
    db = tmp_path / ".pki" / "nssdb"
    db.mkdir(parents=True)
    subprocess.run(["certutil", "-N", "-d", f"sql:{db}", "--empty-password"], check=True)
    subprocess.run(
        ["certutil", "-A", "-d", f"sql:{db}", "-n", "gpulab-test-ca", "-t", "C,,", "-i", ca],
        check=True,
    )
    return str(tmp_path)


def https_hub(home, public: str):
    """A hub started by `gpulab up` with GPULAB_PUBLIC_URL=``public`` (Caddy in front),
    yielded with ``url`` = ``public``; then `gpulab down`, and Caddy gone with it."""
    hub = start_hub(home, hub_env(home, GPULAB_PUBLIC_URL=public))
    hub.url = public
    yield hub
    down = hub.gpulab("down")
    assert down.returncode == 0, down.stderr
    with pytest.raises(requests.ConnectionError):
        requests.get(public, verify=False, timeout=5)
