"""SSH into projects, the hub's side: users' keys, the SSH page, the gateway's access API.

- The key store (ssh/keys.py) takes one public key line of an allowed type and refuses
  hostile input: authorized_keys options, private keys, huge text, NUL bytes, DSA and
  small RSA keys, a key of another account, a linked or damaged user file.
- /hub/gpulab/ssh on the real session hub: a user adds the key Debian's ssh-keygen
  made, sees it with the fingerprint ``ssh-keygen -lf`` prints, deletes it; a POST
  without XSRF is refused; another user neither sees nor deletes it; the page gives the
  ssh command of each project the user may open a shell in, and Chromium shows it.
- /hub/api/gpulab/ssh/access/<user>/<owner>/<project> answers the gateway's token
  (made the way JupyterHub makes a service's tokens, in the hub's database) for the
  owner, a collaborator (own share or group's), a viewer, and refuses alike a stranger,
  a revoked share, an unapproved account and an unknown project; a user's, a
  collaborator's or an admin's token gets 403.
"""

from __future__ import annotations

import base64
import re
import struct
import subprocess
from pathlib import Path

import asyncssh
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulab_hub import ssh
from gpulab_hub.ssh import hubapi, keys
from gpulab_hub.ssh.keys import KeyRefused, KeyStore
from gpulab_hub.ssh.settings import Settings as GatewaySettings

OWNER, PROJECT = "skowner", "sshp"
COLLAB, VIEWER, STRANGER = "skcollab", "skviewer", "skstranger"
MEMBER, REVOKED, LAPSED = "skmember", "skrevoked", "sklapsed"
GROUP = "skgroup"


# --- keys, made as users make them -------------------------------------------------
def keygen(folder: Path, name: str, kind: str = "ed25519") -> Path:
    """A key pair made by Debian's OpenSSH ssh-keygen; the private key's path."""
    path = folder / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", f"{name}@laptop", "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path


def keygen_fingerprint(pub: Path) -> str:
    """What ``ssh-keygen -lf`` prints as the fingerprint: "256 SHA256:... c (ED25519)"."""
    out = subprocess.run(["ssh-keygen", "-lf", str(pub)], check=True, capture_output=True)
    return out.stdout.decode().split()[1]


def asyncssh_pub(algorithm: str, **kw) -> str:
    return (
        asyncssh.generate_private_key(algorithm, comment="made@here", **kw)
        .export_public_key("openssh")
        .decode()
    )


def sk_pub(kind: str) -> str:
    """A security-key (FIDO) public key line, as OpenSSH writes one."""

    def s(b: bytes) -> bytes:
        return struct.pack(">I", len(b)) + b

    if kind == "ed25519":
        pub = asyncssh.generate_private_key("ssh-ed25519").public_data[-32:]
        blob = s(b"sk-ssh-ed25519@openssh.com") + s(pub) + s(b"ssh:")
        return f"sk-ssh-ed25519@openssh.com {base64.b64encode(blob).decode()} yubikey"
    from asyncssh.packet import SSHPacket

    packet = SSHPacket(asyncssh.generate_private_key("ecdsa-sha2-nistp256").public_data)
    packet.get_string()
    curve, point = packet.get_string(), packet.get_string()
    blob = s(b"sk-ecdsa-sha2-nistp256@openssh.com") + s(curve) + s(point) + s(b"ssh:")
    return f"sk-ecdsa-sha2-nistp256@openssh.com {base64.b64encode(blob).decode()} yubikey"


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, str]:
    """Public (and private) keys of every kind, each made once."""
    return make_keys(tmp_path_factory.mktemp("keys"))


def make_keys(folder: Path) -> dict[str, str]:
    """Public (and private) keys of every kind, made in ``folder``."""
    ed = keygen(folder, "ed")
    return {
        "ed25519": ed.with_suffix(".pub").read_text(),
        "ed25519_private": ed.read_text(),
        "ed25519_fingerprint": keygen_fingerprint(ed.with_suffix(".pub")),
        "ecdsa256": keygen(folder, "ec", "ecdsa").with_suffix(".pub").read_text(),
        "ecdsa384": asyncssh_pub("ecdsa-sha2-nistp384"),
        "ecdsa521": asyncssh_pub("ecdsa-sha2-nistp521"),
        "rsa2048": asyncssh_pub("ssh-rsa", key_size=2048),
        "rsa1024": asyncssh_pub("ssh-rsa", key_size=1024),
        "rsa_private_pem": asyncssh.generate_private_key("ssh-rsa", key_size=1024)
        .export_private_key("pkcs1-pem")
        .decode(),
        "pkcs8_private": asyncssh.generate_private_key("ecdsa-sha2-nistp256")
        .export_private_key("pkcs8-pem")
        .decode(),
        "dsa": asyncssh_pub("ssh-dss"),
        "sk_ed25519": sk_pub("ed25519"),
        "sk_ecdsa": sk_pub("ecdsa"),
    }


# --- the store ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kind", ["ed25519", "ecdsa256", "ecdsa384", "ecdsa521", "rsa2048", "sk_ed25519", "sk_ecdsa"]
)
def test_the_store_takes_each_allowed_kind_of_key(tmp_path, made, kind):
    store = KeyStore(tmp_path / "keys")
    key = store.add("alice", made[kind])
    assert store.keys("alice") == [key]
    # What the gateway compares: the public blob of the line it reads back.
    given_key = asyncssh.import_public_key(made[kind])
    assert asyncssh.import_public_key(key.openssh).public_data == given_key.public_data
    assert key.fingerprint == given_key.get_fingerprint("sha256")
    assert key.openssh.startswith(key.algorithm + " ") and "\n" not in key.openssh
    assert key.algorithm == made[kind].split()[0]


def test_the_fingerprint_is_the_one_ssh_keygen_prints(tmp_path, made):
    key = KeyStore(tmp_path / "keys").add("alice", made["ed25519"])
    assert key.fingerprint == made["ed25519_fingerprint"]
    assert (key.algorithm, key.comment) == ("ssh-ed25519", "ed@laptop")


HOSTILE = [
    # (what is pasted, words the refusal must say)
    (lambda m: 'from="10.0.0.1" ' + m["ed25519"], "no options"),
    (lambda m: 'command="/bin/sh -c id",no-pty ' + m["ed25519"], "no options"),
    (lambda m: "restrict " + m["ed25519"], "no options"),
    (lambda m: 'environment="LD_PRELOAD=/x.so" ' + m["ed25519"], "no options"),
    (lambda m: m["ed25519_private"], "That is a private key: paste the .pub file"),
    (lambda m: m["rsa_private_pem"], "That is a private key: paste the .pub file"),
    (lambda m: m["pkcs8_private"], "That is a private key: paste the .pub file"),
    (lambda m: "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\n", "private key"),
    (lambda m: m["ed25519"].strip() + " " + "x" * (1 << 20), "too long"),
    (lambda m: m["ed25519"].replace(" ", "\x00", 1), "characters no SSH public key has"),
    (lambda m: m["ed25519"].strip() + "\x00", "characters no SSH public key has"),
    (lambda m: m["ed25519"] + m["ecdsa256"], "one key at a time"),
    (lambda m: m["dsa"], "does not take ssh-dss keys"),
    (lambda m: m["rsa1024"], "That RSA key has 1024 bits"),
    (lambda m: "ssh-ed25519-cert-v01@openssh.com AAAA", "does not take"),
    (lambda m: "ssh-rsa " + m["ed25519"].split()[1], "not a whole SSH public key"),
    (lambda m: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA", "not a whole SSH public key"),
    (lambda m: "ssh-ed25519 not!base64", "not a whole SSH public key"),
    (lambda m: "hello there", "not an SSH public key"),
    (lambda m: "   \n ", "Paste your public key"),
]


@pytest.mark.parametrize("case", range(len(HOSTILE)))
def test_the_store_refuses_hostile_input(tmp_path, made, case):
    make, words = HOSTILE[case]
    store = KeyStore(tmp_path / "keys")
    with pytest.raises(KeyRefused) as refused:
        store.add("alice", make(made))
    assert words in str(refused.value)
    assert store.keys("alice") == []
    assert "PRIVATE" not in str(refused.value) and "AAAA" not in str(refused.value)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300) | st.from_regex(r"(ssh-ed25519|ssh-rsa|x) [A-Za-z0-9+/=]{0,80}( .*)?"))
def test_any_text_is_refused_or_a_clean_key(text):
    try:
        key = keys.parse(text)
    except KeyRefused as e:
        assert str(e)
        return
    assert key.algorithm in keys.ALGORITHMS
    line = r"[a-z0-9@.-]+ [A-Za-z0-9+/]+={0,2}( [A-Za-z0-9 ._@+:=,()/#-]+)?"
    assert re.fullmatch(line, key.openssh)


def test_a_key_names_one_person(tmp_path, made):
    store = KeyStore(tmp_path / "keys")
    store.add("alice", made["ed25519"])
    with pytest.raises(KeyRefused, match="on your account already"):
        store.add("alice", made["ed25519"])
    with pytest.raises(KeyRefused, match="already on another gpulab account"):
        store.add("bob", made["ed25519"].replace("ed@laptop", "bob's copy"))
    assert store.keys("bob") == []


def test_at_most_twenty_keys(tmp_path):
    store = KeyStore(tmp_path / "keys")
    for _ in range(keys.MAX_KEYS):
        store.add("alice", asyncssh_pub("ssh-ed25519"))
    with pytest.raises(KeyRefused, match="You have 20 keys"):
        store.add("alice", asyncssh_pub("ssh-ed25519"))
    assert len(store.keys("alice")) == keys.MAX_KEYS


def test_remove_and_remove_all(tmp_path, made):
    store = KeyStore(tmp_path / "keys")
    one = store.add("alice", made["ed25519"])
    two = store.add("alice", made["ecdsa256"])
    assert store.remove("bob", one.fingerprint) is False
    assert store.remove("alice", one.fingerprint) is True
    assert store.keys("alice") == [two]
    store.remove_all("alice")
    assert store.keys("alice") == [] and not (tmp_path / "keys" / "alice.json").exists()


def test_user_files_are_never_followed_or_read_whole(tmp_path, made):
    folder = tmp_path / "keys"
    store = KeyStore(folder)
    store.add("alice", made["ed25519"])
    # bob's file is a link to alice's: bob gets no key of hers
    (folder / "bob.json").symlink_to(folder / "alice.json")
    assert store.keys("bob") == []
    # a FIFO does not block, a huge file is not read
    import os

    os.mkfifo(folder / "carol.json")
    assert store.keys("carol") == []
    (folder / "dave.json").write_bytes(b'{"keys": [' + b" " * (keys.MAX_FILE + 10) + b"]}")
    assert store.keys("dave") == []
    # a damaged file gives no keys, and the next change moves it aside
    (folder / "erin.json").write_text("{not json")
    assert store.keys("erin") == []
    store.add("erin", made["ecdsa256"])
    assert [k.algorithm for k in store.keys("erin")] == ["ecdsa-sha2-nistp256"]
    assert any(p.name.startswith("erin.json.corrupt-") for p in folder.iterdir())
    # adding for bob replaces the link, never writes through it
    store.add("bob", made["ecdsa384"])
    assert not (folder / "bob.json").is_symlink()
    assert [k.fingerprint for k in store.keys("alice")] == [keys.parse(made["ed25519"]).fingerprint]


@pytest.mark.parametrize("name", ["../alice", "alice/x", ".hidden", "", "Alice", "a" * 70, "a\n"])
def test_names_that_no_account_has_make_no_paths(tmp_path, made, name):
    store = KeyStore(tmp_path / "keys")
    assert store.keys(name) == []
    with pytest.raises(ValueError):
        store.add(name, made["ed25519"])
    assert not any(tmp_path.rglob("*.json"))


# --- the hub's configuration ---------------------------------------------------------
def configured(**env):
    from traitlets.config import Config

    from gpulab_hub import hubconfig

    c = Config()
    hubconfig.apply(c, {"GPULAB_HOME": "/srv/x", "GPULAB_HUB_IP": "127.0.0.1", **env}, "/i")
    return c


def test_configure_adds_the_gateway_its_role_and_pages(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/other.sock")
    monkeypatch.delenv("DOCKER_TLS_VERIFY", raising=False)
    monkeypatch.delenv("DOCKER_CERT_PATH", raising=False)
    c = configured(GPULAB_SSH_PORT="2200", GPULAB_BIND_URL="http://10.1.2.3:8000")
    (service,) = [s for s in c.JupyterHub.services if s["name"] == ssh.SERVICE]
    assert service["command"][1:] == ["-m", "gpulab_hub.ssh"]
    where = ssh.paths("/srv/x/hub")
    env = service["environment"]
    assert env["DOCKER_HOST"] == "unix:///run/other.sock"
    assert "GPULAB_ADMIN_PASSWORD" not in env["GPULAB_SETTINGS"]  # no secrets handed on
    # what the gateway reads from that environment (and JupyterHub's own variables)
    hub_api = {"JUPYTERHUB_API_URL": "http://127.0.0.1:8081/hub/api", "JUPYTERHUB_API_TOKEN": "t"}
    got = GatewaySettings.from_env({**env, **hub_api})
    assert (got.bind, got.port, got.prefix, got.recheck_s) == ("10.1.2.3", 2200, "gpulab", 15.0)
    assert (got.host_key, got.keys_dir, got.log) == (
        where["host_key"],
        where["keys_dir"],
        str(where["log"]),
    )
    assert (got.limits.user_failures, got.limits.lockout_s) == (5, 300)
    role = next(r for r in c.JupyterHub.load_roles if r["name"] == ssh.SERVICE)
    assert role == {"name": ssh.SERVICE, "scopes": ssh.SCOPES, "services": [ssh.SERVICE]}
    assert ssh.GATEWAY_SCOPE in c.JupyterHub.custom_scopes
    assert "custom:gpulab:execute" in c.JupyterHub.custom_scopes  # merged, not replaced
    from gpulab_hub.sharing import roles

    assert ssh.GATEWAY_SCOPE not in roles.CUSTOM_SCOPES  # the module's dict is untouched
    patterns = [h[0] for h in c.JupyterHub.extra_handlers]
    assert "/gpulab/ssh" in patterns and any(p.startswith(ssh.API) for p in patterns)
    assert str(ssh.TEMPLATES) in c.JupyterHub.template_paths


def test_port_0_means_no_gateway_but_the_page_says_so():
    c = configured(GPULAB_SSH_PORT="0")
    assert not [s for s in c.JupyterHub.services if s["name"] == ssh.SERVICE]
    assert not [r for r in c.JupyterHub.load_roles if r["name"] == ssh.SERVICE]
    page = next(h for h in c.JupyterHub.extra_handlers if h[0] == "/gpulab/ssh")
    assert page[2]["port"] == 0
    html = render_page(port=0)
    assert "SSH is off on this gpulab" in html and "How to connect" not in html


@pytest.mark.parametrize(
    "env",
    [
        {"GPULAB_SSH_PORT": "65536"},
        {"GPULAB_SSH_PORT": "22 "},
        {"GPULAB_SSH_PORT": "-1"},
        {"GPULAB_SSH_PORT": "0x16"},
        {"GPULAB_SSH_BIND": "0.0.0.0; rm -rf /"},
        {"GPULAB_SSH_BIND": "host name"},
        {"GPULAB_SSH_BIND": "-oProxyCommand=x"},
    ],
)
def test_configure_refuses_bad_settings(env):
    with pytest.raises(ValueError, match="GPULAB_SSH_"):
        configured(**env)


def test_the_bind_address_defaults_to_the_hubs():
    from gpulab_hub import settings

    assert settings.parse({"GPULAB_BIND_URL": "http://[::1]:8000"}).ssh_bind == "::1"
    assert settings.parse({"GPULAB_BIND_URL": "http://0.0.0.0:8000"}).ssh_bind == "0.0.0.0"
    assert settings.parse({"GPULAB_SSH_BIND": "ssh.example.org"}).ssh_bind == "ssh.example.org"


def render_page(**values) -> str:
    """The page's template, in a stand-in for JupyterHub's page.html."""
    import jinja2

    from gpulab_hub import home

    loader = jinja2.ChoiceLoader(
        [
            jinja2.DictLoader(
                {"page.html": "{% block main %}{% endblock %}{% block script %}{% endblock %}"}
            ),
            jinja2.FileSystemLoader([str(ssh.TEMPLATES), str(home.TEMPLATES)]),
        ]
    )
    env = jinja2.Environment(loader=loader, autoescape=True)
    base = {"keys": [], "port": 2222, "host": "h", "own": [], "shared": [], "viewed": []}
    base |= {"host_key": None, "token_url": "/hub/token", "message": "", "error": ""}
    base |= {"xsrf": "x", "base_url": "/hub/"}
    return env.get_template("gpulab-ssh.html").render(**{**base, **values})


def test_the_access_messages_reveal_nothing():
    assert hubapi.not_found("bob", "alice", "one") == "alice has no project one shared with you."
    assert hubapi.not_found("alice", "alice", "one") == "You have no project one."
