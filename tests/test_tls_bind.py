"""Without GPULAB_PUBLIC_URL, gpulab listens on 127.0.0.1 only, and `gpulab up` says how
to open it to other people (docs/security.md, "Who can reach the hub")."""

from __future__ import annotations

import ipaddress
import subprocess
from urllib.parse import urlsplit

import pytest
import requests
from traitlets.config import Config

from gpulab_hub import hubconfig, settings


def non_loopback_ipv4() -> str:
    """An IPv4 address of this machine other than loopback (`hostname -I`)."""
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=True).stdout
    for word in out.split():
        ip = ipaddress.ip_address(word)
        if ip.version == 4 and not ip.is_loopback:
            return word
    raise AssertionError(f"this machine has no IPv4 address besides loopback: {out!r}")


def test_the_default_listens_on_this_machine_only():
    assert urlsplit(settings.parse({}).bind_url).hostname == "127.0.0.1"
    c = Config()
    hubconfig.apply(c, {}, images_dir="/x")
    assert urlsplit(c.JupyterHub.bind_url).hostname == "127.0.0.1"


def test_an_admins_bind_url_is_kept():
    c = Config()
    hubconfig.apply(c, {"GPULAB_BIND_URL": "http://0.0.0.0:8000"}, images_dir="/x")
    assert c.JupyterHub.bind_url == "http://0.0.0.0:8000"


def test_a_hub_on_loopback_is_not_reachable_from_the_network(hub):
    """The session hub (`gpulab up`, no GPULAB_PUBLIC_URL) answers on 127.0.0.1 and
    refuses a connection to the machine's network address; `gpulab up` said so."""
    port = urlsplit(hub.url).port
    assert requests.get(f"http://127.0.0.1:{port}/hub/api/", timeout=5).status_code == 200
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://{non_loopback_ipv4()}:{port}/hub/api/", timeout=5)
    said = " ".join(hub.up_output.split())
    assert "This hub listens on 127.0.0.1 (only this machine can open it)" in said
    assert "set GPULAB_PUBLIC_URL=https://<name>" in said
    assert "docs/deployment.md" in said
