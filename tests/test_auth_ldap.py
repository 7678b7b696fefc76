"""GPULAB_AUTHENTICATOR=ldap against a real directory: Debian's slapd, started here on a
127.0.0.1 port with its configuration and database in a temporary folder (two people,
one group, and a guest whose entry elsewhere in the directory is named ``Alice``).
alice logs in with her LDAP password and her group becomes her JupyterHub group; a
wrong password, and bob (in no allowed group), are refused; the guest, whose uid folds
to alice's, never gets into alice's account (each account is bound to its entry)."""

from __future__ import annotations

import asyncio
import shutil
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from tornado import web
from traitlets.config import Config

from gpulab_hub import hubconfig
from gpulab_hub.accounts import auth
from gpulab_hub.db import migrate

SUFFIX = "dc=gpulab,dc=test"
GROUP = f"cn=gpu-team,ou=groups,{SUFFIX}"
PASSWORDS = {"alice": "alice's LDAP password", "bob": "bob's LDAP password"}
# Another entry, in another branch the hub binds in too: its uid is alice's but for
# case (uid matches ignoring case), its password its owner's, and it is in the group.
GUEST = f"uid=Alice,ou=guests,{SUFFIX}"
GUEST_PASSWORD = "the guest's own LDAP password"

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
            f"dn: ou=guests,{SUFFIX}\nobjectClass: organizationalUnit\nou: guests\n",
            *people,
            f"dn: {GUEST}\nobjectClass: inetOrgPerson\nuid: Alice\ncn: Alice Guest\n"
            f"sn: Guest\nuserPassword: {_hash(GUEST_PASSWORD)}\n",
            f"dn: {GROUP}\nobjectClass: groupOfNames\ncn: gpu-team\n"
            f"member: uid=alice,ou=people,{SUFFIX}\nmember: {GUEST}\n",
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


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """The in-process logins' GPULAB_HOME: where their accounts' identities are kept."""
    return tmp_path_factory.mktemp("gpulab-ldap-logins")


def authenticator(slapd, home, env=(), **traits):
    c = Config()
    env = {"GPULAB_HOME": str(home), "GPULAB_HUB_IP": "127.0.0.1", **ldap_env(*slapd), **dict(env)}
    hubconfig.apply(c, env, images_dir="/nonexistent")
    for name, value in traits.items():  # the admin's own lines (jupyterhub_config.py)
        c.LDAPAuthenticator[name] = value
    hubconfig.finish(c)
    assert c.JupyterHub.authenticator_class.endswith("GpulabLDAPAuthenticator")
    # the database the hub's start makes (its tables; the bindings live there)
    migrate.upgrade(c.BoundLogin.identities_db_url, backup=False)
    return auth.GpulabLDAPAuthenticator(config=c)


def login(a, name: str, password: str):
    """What JupyterHub's login does with the form: authenticate, then the allow check."""

    async def go():
        model = await a.get_authenticated_user(None, {"username": name, "password": password})
        return model

    return asyncio.run(go())


def test_alice_logs_in_with_her_ldap_password_and_her_group_becomes_hers(slapd, home):
    model = login(authenticator(slapd, home), "alice", PASSWORDS["alice"])
    assert model is not None and model["name"] == "alice"
    assert model["groups"] == ["gpu-team"]


def test_a_wrong_password_is_refused(slapd, home):
    assert login(authenticator(slapd, home), "alice", "not her password") is None
    assert login(authenticator(slapd, home), "alice", "") is None


def test_someone_in_no_allowed_group_is_refused(slapd, home):
    # bob's password is right, but he is not in GPULAB_LDAP_GROUPS
    assert login(authenticator(slapd, home), "bob", PASSWORDS["bob"]) is None


def test_a_name_with_a_filter_or_dn_character_is_refused(slapd, home):
    # an attacker's try at LDAP injection into the bind DN or the group search
    for name in ("alice)(uid=*", "*", "alice,ou=people"):
        assert login(authenticator(slapd, home), name, PASSWORDS["alice"]) is None


# --- one entry, one account: another entry whose uid folds to alice's ---------------
BOTH_BRANCHES = [f"uid={{username}},ou=people,{SUFFIX}", f"uid={{username}},ou=guests,{SUFFIX}"]


def refusal(a, name: str, password: str) -> str:
    """The words of a login gpulab refuses with a page of its own (403)."""
    with pytest.raises(web.HTTPError) as refused:
        login(a, name, password)
    assert refused.value.status_code == 403
    return refused.value.log_message % refused.value.args


def bound(home) -> dict:
    """Each bound account's identity, as the hub's database keeps it."""
    with sqlite3.connect(home / "hub" / "jupyterhub.sqlite") as con:
        rows = con.execute("SELECT name, provider, subject FROM gpulab_login_identities")
        return {name: {"provider": p, "id": sub} for name, p, sub in rows}


def test_another_entry_whose_uid_folds_to_alices_never_gets_her_account(slapd, tmp_path):
    # the hub binds people in two branches (the admin's bind_dn_template); the guest's
    # entry uid=Alice,ou=guests is another person, with their own password, in the group
    a = authenticator(slapd, tmp_path, bind_dn_template=BOTH_BRANCHES)
    model = login(a, "alice", PASSWORDS["alice"])
    assert model is not None and model["name"] == "alice" and model["groups"] == ["gpu-team"]
    # her first login bound the account to her entry (its entryUUID)
    assert bound(tmp_path)["alice"]["id"].startswith("entryUUID="), bound(tmp_path)

    # the guest types "alice" and the guest's own password: the directory binds
    # uid=alice,ou=guests (uid matches ignoring case), so before, this was alice's account
    words = refusal(a, "alice", GUEST_PASSWORD)
    assert "Another account of your lab's directory already signed in to gpulab as 'alice'" in (
        words
    )
    assert "Ask a gpulab admin" in words
    # with the directory's own spelling: refused by ldapauthenticator's name rule, and
    # where the admin allows capitals, by gpulab's (a name must be written as gpulab takes it)
    assert login(a, "Alice", GUEST_PASSWORD) is None
    loose = authenticator(
        slapd, tmp_path, bind_dn_template=BOTH_BRANCHES, valid_username_regex=r"^[A-Za-z]+$"
    )
    words = refusal(loose, "Alice", GUEST_PASSWORD)
    assert "as 'Alice', but gpulab takes a user name only as it is written in lower case" in words
    # alice herself still logs in, as herself, and is still the admin's account
    again = login(loose, "alice", PASSWORDS["alice"])
    assert again is not None and again["name"] == "alice" and again["admin"] is True
    assert list(bound(tmp_path)) == ["alice"]


def test_the_admins_name_is_only_the_entry_the_admin_set(slapd, tmp_path):
    # GPULAB_ADMIN_IDENTITY names the admin's entry: nobody else gets the name, even first
    env = {"GPULAB_ADMIN_IDENTITY": "entryUUID=00000000-0000-0000-0000-000000000000"}
    words = refusal(authenticator(slapd, tmp_path, env), "alice", PASSWORDS["alice"])
    assert "The gpulab account 'alice' is kept for another account of your lab's" in words
    assert not bound(tmp_path)


def entry_uuid(slapd, name: str) -> str:
    """The directory's own id of ``name``'s entry, read as the directory's admin would."""
    import ldap3

    server = ldap3.Server(slapd[0], port=slapd[1])
    admin = f"cn=admin,{SUFFIX}"
    with ldap3.Connection(server, admin, "the directory admin password", auto_bind=True) as c:
        c.search(
            f"uid={name},ou=people,{SUFFIX}",
            "(objectClass=*)",
            ldap3.BASE,
            attributes=["entryUUID"],
        )
        return str(c.entries[0].entryUUID)


def test_the_admin_outside_every_allowed_group_gets_in_only_as_the_entry_named(slapd, tmp_path):
    # bob is in no allowed group; made the admin by name alone, he is refused like anyone
    env = {"GPULAB_ADMIN": "bob"}
    assert login(authenticator(slapd, tmp_path, env), "bob", PASSWORDS["bob"]) is None
    # named by his entry (GPULAB_ADMIN_IDENTITY), he is let in, the admin
    env["GPULAB_ADMIN_IDENTITY"] = f"entryUUID={entry_uuid(slapd, 'bob')}"
    model = login(authenticator(slapd, tmp_path, env), "bob", PASSWORDS["bob"])
    assert model is not None and model["name"] == "bob" and model["admin"] is True


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
