"""A box at home reached by its IP address alone, over a LAN or a private VPN, from a
laptop and a phone (docs/deployment.md, "Reached by IP").

The LAN is real: a veth pair, this machine at 10.223.N.1, the other devices in a
network namespace of their own at 10.223.N.2 that reaches gpulab only over that link.
The hub runs with ``GPULAB_PUBLIC_URL=https://10.223.N.1:PORT``: Caddy serves HTTPS for
the address from its own CA, and every project is on the hub's origin (an address has
no subdomains). From the device: curl and a laptop's Chromium without the CA are
stopped at the certificate; with the CA installed, curl gets the login page and a
phone's Chromium (Pixel 7 screen and user agent) logs in and opens the project's
JupyterLab."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from browser_kit import SHOTS
from conftest import PREFIX, free_port
from tls_kit import TlsUser, ca_of, https_hub, nss_home

pytestmark = [pytest.mark.docker, pytest.mark.browser]

TESTS = Path(__file__).resolve().parent
PROJECT = "lanproj"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@pytest.fixture(scope="module")
def lan():
    """(the device's network namespace, this machine's address on the LAN)."""
    tag = hashlib.sha256(PREFIX.encode()).hexdigest()[:6]
    ns, host_if, dev_if = f"{PREFIX}lan", f"gl{tag}h", f"gl{tag}d"
    subnet = f"10.223.{int(tag, 16) % 200 + 20}"
    assert f"{subnet}." not in _ip("route").stdout, f"{subnet}.0/24 is in use here"

    def remove() -> None:
        _ip("netns", "del", ns, check=False)
        _ip("link", "del", host_if, check=False)

    remove()
    _ip("netns", "add", ns)
    _ip("link", "add", host_if, "type", "veth", "peer", "name", dev_if)
    _ip("link", "set", dev_if, "netns", ns)
    _ip("addr", "add", f"{subnet}.1/24", "dev", host_if)
    _ip("link", "set", host_if, "up")
    for cmd in (["addr", "add", f"{subnet}.2/24", "dev", dev_if], ["link", "set", dev_if, "up"],
                ["link", "set", "lo", "up"]):  # fmt: skip
        _ip("netns", "exec", ns, "ip", *cmd)
    yield ns, f"{subnet}.1"
    remove()


@pytest.fixture(scope="module")
def lan_hub(docker_engine, tmp_path_factory, lan):
    _, address = lan
    home = tmp_path_factory.mktemp("gpulab-lan")
    yield from https_hub(home, f"https://{address}:{free_port()}")


def on_device(ns: str, args: list[str], home: str) -> subprocess.CompletedProcess:
    """``args`` run on the device: in its network namespace, with its own HOME and no
    proxy settings (a phone on the LAN has none)."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(HOME=home, PYTHONPATH=str(TESTS))
    return subprocess.run(
        ["ip", "netns", "exec", ns, *args], env=env, capture_output=True, text=True, timeout=240
    )


def test_up_says_to_install_the_ca_and_that_an_address_has_no_subdomains(lan_hub):
    said = " ".join(lan_hub.up_output.split())
    assert f"gpulab is running: open {lan_hub.url}/" in said
    assert "An IP address has no subdomains" in said
    ca_of(lan_hub)


def test_a_laptop_and_a_phone_on_the_lan_open_it_by_its_address(lan, lan_hub, tmp_path):
    ns, address = lan
    ca = ca_of(lan_hub)
    admin = TlsUser(lan_hub.url, "admin", lan_hub.admin_password, ca)
    assert admin.login().status_code == 302
    # the login cookies are sent over HTTPS only (accounts.cookie_options)
    cookies = {c.name: c for c in admin.http.cookies if c.path.startswith("/hub")}
    assert cookies["jupyterhub-hub-login"].secure, cookies
    admin.new_token()
    server = admin.start_project(PROJECT)
    assert server["url"].startswith("/user/admin/"), server["url"]  # the hub's origin

    bare = str(tmp_path / "bare")
    os.makedirs(bare)
    login = lan_hub.url + "/hub/login"
    # Without the CA: curl and the laptop's browser are stopped at the certificate.
    refused = on_device(ns, ["curl", "-sS", "-o", "/dev/null", login], bare)
    assert refused.returncode == 60, refused.stderr  # "SSL certificate problem"
    laptop = on_device(ns, [sys.executable, str(TESTS / "lan_device.py"), lan_hub.url,
                            "admin", lan_hub.admin_password, PROJECT,
                            str(SHOTS / "lan-laptop.png")], bare)  # fmt: skip
    assert laptop.returncode == 0, laptop.stderr
    assert "ERR_CERT_AUTHORITY_INVALID" in json.loads(laptop.stdout)["error"]

    # With the CA installed: the login page, then the phone's JupyterLab.
    got = on_device(ns, ["curl", "-sS", "--cacert", ca, "-w", "%{http_code}", login], bare)
    assert got.returncode == 0, got.stderr
    assert got.stdout.endswith("200") and 'id="username_input"' in got.stdout
    trusting = nss_home(tmp_path / "phone", ca)
    SHOTS.mkdir(exist_ok=True)
    phone = on_device(ns, [sys.executable, str(TESTS / "lan_device.py"), lan_hub.url,
                           "admin", lan_hub.admin_password, PROJECT,
                           str(SHOTS / "lan-phone.png"), "--phone"], trusting)  # fmt: skip
    assert phone.returncode == 0, phone.stderr[-3000:]
    seen = json.loads(phone.stdout)
    print(f"\nthe phone saw: {seen}")
    assert seen["origin"] == lan_hub.url  # one origin: the address has no subdomains
    assert seen["url"].startswith(f"{lan_hub.url}/user/admin/{PROJECT}/lab")
    assert seen["mobile"] and seen["width"] < 500
    admin.stop_project(PROJECT)
