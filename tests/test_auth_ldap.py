"""GPULAB_AUTHENTICATOR=ldap against a real directory: Debian's slapd, started here on a
127.0.0.1 port with its configuration and database in a temporary folder (two people,
one group). alice logs in with her LDAP password and her group becomes her JupyterHub
group; a wrong password, and bob (in no allowed group), are refused."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from traitlets.config import Config

from gpulab_hub import hubconfig
from gpulab_hub.accounts import auth

SUFFIX = "dc=gpulab,dc=test"
GROUP = f"cn=gpu-team,ou=groups,{SUFFIX}"
PASSWORDS = {"alice": "alice's LDAP password", "bob": "bob's LDAP password"}

pytestmark = pytest.mark.skipif(
    shutil.which("slapd") is None and not Path("/usr/sbin/slapd").exists(),
    reason="Debian's slapd is not installed (apt-get install -y slapd ldap-utils)",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _hash(password: str) -> str:
    out = subprocess.run(
        ["/usr/sbin/slappasswd", "-s", password], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


@pytest.fixture(scope="module")
def slapd(tmp_path_factory):
    """A running slapd; its ldap:// URL's host and port."""
    root = tmp_path_factory.mktemp("slapd")
    (root / "db").mkdir()
    conf = root / "slapd.conf"
    conf.write_text(
        "\n".join(
            [
                *(
                    f"include /etc/ldap/schema/{s}.schema"
                    for s in ("core", "cosine", "inetorgperson", "nis")
                ),  # fmt: skip
                "modulepath /usr/lib/ldap",
                "moduleload back_mdb",
                f"pidfile {root}/slapd.pid",
                "database mdb",
                "maxsize 10485760",
                f'suffix "{SUFFIX}"',
                f'rootdn "cn=admin,{SUFFIX}"',
                f"rootpw {_hash('the directory admin password')}",
                f"directory {root}/db",
                "",
            ]
        )
    )
    people = [
        f"dn: uid={name},ou=people,{SUFFIX}\nobjectClass: inetOrgPerson\nuid: {name}\n"
        f"cn: {name.title()}\nsn: {name.title()}\nuserPassword: {_hash(pw)}\n"
        for name, pw in PASSWORDS.items()
    ]
    ldif = "\n".join(
        [
            f"dn: {SUFFIX}\nobjectClass: dcObject\nobjectClass: organization\no: gpulab\n"
            "dc: gpulab\n",
            f"dn: ou=people,{SUFFIX}\nobjectClass: organizationalUnit\nou: people\n",
            f"dn: ou=groups,{SUFFIX}\nobjectClass: organizationalUnit\nou: groups\n",
            *people,
            f"dn: {GROUP}\nobjectClass: groupOfNames\ncn: gpu-team\n"
            f"member: uid=alice,ou=people,{SUFFIX}\n",
        ]
    )
    (root / "data.ldif").write_text(ldif)
    subprocess.run(
        ["/usr/sbin/slapadd", "-f", str(conf), "-l", str(root / "data.ldif")],
        check=True,
        capture_output=True,
    )
    port = _free_port()
    proc = subprocess.Popen(
        ["/usr/sbin/slapd", "-f", str(conf), "-h", f"ldap://127.0.0.1:{port}/", "-d", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"slapd did not start: {proc.stderr.read()[-2000:]!r}") from None
            time.sleep(0.1)
    yield "127.0.0.1", port
    proc.terminate()
    proc.wait(timeout=10)


def ldap_env(host: str, port: int) -> dict[str, str]:
    return {
        "GPULAB_AUTHENTICATOR": "ldap",
        "GPULAB_LDAP_SERVER": host,
        "GPULAB_LDAP_PORT": str(port),
        # slapd on this machine, without a certificate: the only place `insecure` is fit
        "GPULAB_LDAP_TLS": "insecure",
        "GPULAB_LDAP_BIND_DN_TEMPLATE": f"uid={{username}},ou=people,{SUFFIX}",
        "GPULAB_LDAP_GROUPS": GROUP,
        "GPULAB_ADMIN": "alice",
    }


def authenticator(slapd):
    c = Config()
    env = {"GPULAB_HOME": "/nonexistent", "GPULAB_HUB_IP": "127.0.0.1", **ldap_env(*slapd)}
    hubconfig.apply(c, env, images_dir="/nonexistent")
    hubconfig.finish(c)
    assert c.JupyterHub.authenticator_class.endswith("GpulabLDAPAuthenticator")
    return auth.GpulabLDAPAuthenticator(config=c)


def login(a, name: str, password: str):
    """What JupyterHub's login does with the form: authenticate, then the allow check."""

    async def go():
        model = await a.get_authenticated_user(None, {"username": name, "password": password})
        return model

    return asyncio.run(go())


def test_alice_logs_in_with_her_ldap_password_and_her_group_becomes_hers(slapd):
    model = login(authenticator(slapd), "alice", PASSWORDS["alice"])
    assert model is not None and model["name"] == "alice"
    assert model["groups"] == ["gpu-team"]


def test_a_wrong_password_is_refused(slapd):
    assert login(authenticator(slapd), "alice", "not her password") is None
    assert login(authenticator(slapd), "alice", "") is None


def test_someone_in_no_allowed_group_is_refused(slapd):
    # bob's password is right, but he is not in GPULAB_LDAP_GROUPS
    assert login(authenticator(slapd), "bob", PASSWORDS["bob"]) is None


def test_a_name_with_a_filter_or_dn_character_is_refused(slapd):
    # an attacker's try at LDAP injection into the bind DN or the group search
    for name in ("alice)(uid=*", "*", "alice,ou=people"):
        assert login(authenticator(slapd), name, PASSWORDS["alice"]) is None


# --- a hub started with GPULAB_AUTHENTICATOR=ldap (the one extra hub start) -----------


@pytest.fixture(scope="module")
def ldap_hub(docker_engine, slapd, tmp_path_factory):
    from conftest import GPULAB, hub_env, start_hub

    home = tmp_path_factory.mktemp("gpulab-ldap-home")
    env = hub_env(home, **ldap_env(*slapd))
    hub = start_hub(home, env)
    yield hub
    down = subprocess.run([GPULAB, "down"], env=env, capture_output=True, text=True)
    assert down.returncode == 0, down.stderr


def test_alice_logs_in_to_gpulab_with_ldap_and_keeps_its_home_page(ldap_hub):
    from hubclient import HubUser

    wrong = HubUser(ldap_hub.url, "alice", "not her password")
    refused = wrong.login()
    assert refused.status_code == 403, refused.status_code
    assert "Invalid username or password" in refused.text

    alice = HubUser(ldap_hub.url, "alice", PASSWORDS["alice"])
    r = alice.login()
    assert r.status_code == 302, (r.status_code, ldap_hub.log[-3000:])
    home = alice.http.get(ldap_hub.url + "/hub/home", timeout=10)
    assert home.status_code == 200
    # gpulab's home page, in the words a person reads, not JupyterHub's own
    assert "Create and start" in home.text and "Your projects" in home.text
    # no sign-up or approval pages: the directory decides who has an account
    assert "Sign-ups waiting" not in home.text
    assert alice.http.get(ldap_hub.url + "/hub/signup", timeout=10).status_code == 404

    # a project made from the home page's form (its REST call) is listed there
    alice.new_token()
    alice.make_project("ldap-demo", "LDAP demo")

    # her LDAP group is her JupyterHub group (what sharing and GPU budgets read)
    me = alice.api("GET", "/hub/api/user").json()
    assert me["groups"] == ["gpu-team"], me
    assert me["admin"] is True  # GPULAB_ADMIN=alice
