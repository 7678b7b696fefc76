"""Users' secrets, without a hub: the name and value rules, the store in the hub's
database (no plaintext in it, projects' choices following their renames and dropped
with their projects and accounts, the limit held by changes at once), the import of
the files of gpulab before its database (links never followed), the key and
JupyterHub's CryptKeeper, and the project server's side: what a kernel, terminal or
job started with a delivery gets (a real kernel, a real terminal manager, a real job),
the client that asks the hub (a real HTTP server), and ``gpulab_jupyter.secrets.get``'s
words."""

from __future__ import annotations

import base64
import hashlib
import os
import secrets as pysecrets
import stat
import time
from pathlib import Path

import pytest
from jupyterhub.crypto import CryptKeeper
from tornado.httpserver import HTTPServer
from tornado.web import Application, RequestHandler
from traitlets.config import Config

from gpulab_hub.secrets import crypt
from gpulab_hub.secrets.names import (
    MAX_VALUE_BYTES,
    SecretRefused,
    check_name,
    check_value,
)
from gpulab_jupyter import secrets as user_secrets
from gpulab_jupyter.secrets import deliver

VALUE = "hf_" + pysecrets.token_urlsafe(30)


# --- names and values ------------------------------------------------------------------
@pytest.mark.parametrize("name", ["HF_TOKEN", "WANDB_API_KEY", "A", "_PRIVATE", "K" * 64])
def test_names_a_user_would_choose_are_accepted(name):
    assert check_name(f" {name} ") == name


@pytest.mark.parametrize(
    "name", ["hf_token", "1TOKEN", "HF TOKEN", "HF-TOKEN", "HF_TOKEN=x", "K" * 65, "TÖKEN", ""]
)
def test_names_outside_the_pattern_are_refused_with_the_rule(name):
    with pytest.raises(SecretRefused, match="capital letters, digits and underscores"):
        check_name(name)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("PATH", "the system and every shell use it"),
        ("HOME", "the system and every shell use it"),
        ("LD_PRELOAD", "program loader"),
        ("PYTHONPATH", "Python reads it"),
        ("PIP_INDEX_URL", "pip reads it"),
        ("JUPYTERHUB_API_TOKEN", "Jupyter and JupyterHub read it"),
        ("JPY_SESSION_NAME", "Jupyter reads it"),
        ("GPULAB_SECRET_NAMES", "gpulab uses it"),
        ("CUDA_VISIBLE_DEVICES", "CUDA reads it"),
        ("NVIDIA_VISIBLE_DEVICES", "NVIDIA container runtime"),
        ("LC_ALL", "language"),
        ("LANG", "language"),
        ("TERM", "terminals"),
        ("VIRTUAL_ENV", "Python environment"),
        ("SSL_CERT_FILE", "certificate authorities"),
        ("HTTPS_PROXY", "proxy"),
        ("HF_HOME", "Hugging Face cache"),
    ],
)
def test_names_that_change_how_things_run_are_refused_with_why(name, why):
    with pytest.raises(SecretRefused) as refused:
        check_name(name)
    said = str(refused.value)
    assert said.startswith(f"{name} cannot name a secret: ") and why in said
    assert "Choose another name" in said


def test_values_are_checked_and_never_quoted_back():
    assert check_value(f"  {VALUE}\n") == VALUE
    assert check_value("x" * MAX_VALUE_BYTES) == "x" * MAX_VALUE_BYTES
    for bad, words in (
        ("", "Enter the secret's value"),
        ("   ", "Enter the secret's value"),
        (VALUE + "\0", "NUL"),
        ("x" * (MAX_VALUE_BYTES + 1), "longer than 16 KiB"),
        ("é" * (MAX_VALUE_BYTES // 2 + 1), "longer than 16 KiB"),  # bytes, not characters
        ("\ud800" + VALUE, "not valid text"),
    ):
        with pytest.raises(SecretRefused, match=words) as refused:
            check_value(bad)
        assert VALUE not in str(refused.value)


# --- the key the store's values are encrypted with (the store: test_secrets_store.py) ----
@pytest.fixture
def keeper(monkeypatch):
    """JupyterHub's CryptKeeper with a key of this test."""
    key = base64.urlsafe_b64encode(os.urandom(32)).decode()
    monkeypatch.setenv(crypt.KEY_ENV, key)
    CryptKeeper.clear_instance()
    yield key
    CryptKeeper.clear_instance()


# --- the key --------------------------------------------------------------------------
def test_the_key_is_made_once_private_and_given_to_the_crypt_keeper(tmp_path):
    path = crypt.ensure_key(tmp_path, environ={})
    assert path == tmp_path / "crypt-key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    first = path.read_bytes()
    assert crypt.ensure_key(tmp_path, environ={}) == path and path.read_bytes() == first
    c = Config()
    assert crypt.configure_keys(c, tmp_path, environ={}) == ""
    assert c.CryptKeeper["keys"] == [first.decode().strip()]
    # The administrator's key wins: gpulab neither makes nor gives its own.
    elsewhere = tmp_path / "admin"
    elsewhere.mkdir()
    assert crypt.ensure_key(elsewhere, environ={crypt.KEY_ENV: "x"}) is None
    assert not (elsewhere / "crypt-key").exists()
    c = Config()
    assert crypt.configure_keys(c, tmp_path, environ={crypt.KEY_ENV: "x"}) == ""
    assert "keys" not in c.CryptKeeper


def test_a_link_or_garbage_in_the_keys_place_is_never_used(tmp_path):
    target = tmp_path / "attacker-key"
    target.write_text(base64.urlsafe_b64encode(os.urandom(32)).decode())
    (tmp_path / "crypt-key").symlink_to(target)
    c = Config()
    assert "a link" in crypt.configure_keys(c, tmp_path, environ={})
    assert "keys" not in c.CryptKeeper
    assert crypt.ensure_key(tmp_path, environ={}) == tmp_path / "crypt-key"  # left as it is
    (tmp_path / "crypt-key").unlink()
    (tmp_path / "crypt-key").write_text("not a key")
    assert "no valid key" in crypt.configure_keys(Config(), tmp_path, environ={})
    missing = tmp_path / "none"
    assert "there is no" in crypt.configure_keys(Config(), missing, environ={})
    # A key that cannot be made: the hub starts all the same, with secrets off.
    assert crypt.ensure_key(missing, environ={}) is None and not missing.exists()


async def test_a_value_encrypted_under_another_key_reads_as_unreadable(keeper, monkeypatch):
    token = await crypt.encrypt(VALUE)
    assert VALUE not in token and await crypt.decrypt(token) == VALUE
    monkeypatch.setenv(crypt.KEY_ENV, base64.urlsafe_b64encode(os.urandom(32)).decode())
    CryptKeeper.clear_instance()
    assert await crypt.decrypt(token) is None
    monkeypatch.setenv(crypt.KEY_ENV, "")
    CryptKeeper.clear_instance()
    with pytest.raises(crypt.SecretsUnavailable, match="Secrets are off on this hub"):
        await crypt.encrypt(VALUE)


# --- the project server's side ----------------------------------------------------------
class _Request:
    def __init__(self, method):
        self.method = method


def _handler(module: str, name: str, method: str, *path_args: str):
    cls = type(name, (), {"__module__": module})
    handler = cls()
    handler.request = _Request(method)
    handler.path_args = list(path_args)
    return handler


def test_which_requests_start_a_process():
    kernels = "jupyter_server.services.kernels.handlers"
    sessions = "jupyter_server.services.sessions.handlers"
    terminals = "jupyter_server_terminals.api_handlers"
    assert deliver.starts_process(_handler(kernels, "MainKernelHandler", "POST"))
    assert not deliver.starts_process(_handler(kernels, "MainKernelHandler", "GET"))
    action = "KernelActionHandler"
    assert deliver.starts_process(_handler(kernels, action, "POST", "k1", "restart"))
    assert not deliver.starts_process(_handler(kernels, action, "POST", "k1", "interrupt"))
    assert deliver.starts_process(_handler(sessions, "SessionRootHandler", "POST"))
    assert deliver.starts_process(_handler(sessions, "SessionHandler", "PATCH"))
    assert deliver.starts_process(_handler(terminals, "TerminalRootHandler", "POST"))
    assert not deliver.starts_process(_handler(terminals, "TerminalHandler", "DELETE"))
    assert not deliver.starts_process(_handler("elsewhere", "MainKernelHandler", "POST"))


def test_a_delivery_adds_names_and_values_and_never_shows_a_value():
    delivery = deliver.Delivery("alice", {"HF_TOKEN": VALUE})
    env = deliver.with_secrets({"PATH": "/bin", "GPULAB_SECRET_NAMES": "OLD"}, delivery)
    assert env == {
        "PATH": "/bin",
        "HF_TOKEN": VALUE,
        "GPULAB_SECRET_NAMES": "HF_TOKEN",
        "GPULAB_STARTED_BY": "alice",
    }
    assert VALUE not in repr(delivery) and VALUE not in str(delivery)
    failed = deliver.Delivery("bob", {}, "gpulab's hub did not answer")
    assert deliver.with_secrets({}, failed) == {
        "GPULAB_SECRETS_PROBLEM": "gpulab's hub did not answer",
        "GPULAB_STARTED_BY": "bob",
    }
    assert deliver.with_secrets({"A": "1"}, None) == {"A": "1"}
    for bad in (b"[]", b'{"env": []}', b'{"env": {"PATH x": "1"}}', b'{"env": {"A": 1}}'):
        with pytest.raises(ValueError):
            deliver.parse_answer(bad)


class _Hub(RequestHandler):
    """The hub's secrets API, as a project server meets it."""

    def get(self, owner, project):
        self.application.settings["asked"].append((owner, project, self.request.headers))
        token = self.request.headers.get("Authorization", "")
        if token == "token owner-token":
            self.finish({"env": {"HF_TOKEN": VALUE}})
        else:
            self.set_status(403)
            self.finish({"status": 403, "message": "Only the project's owner and collaborators"})


@pytest.fixture
async def hub_api():
    asked: list = []
    app = Application([(r"/hub/api/gpulab/secrets/([^/]+)/([^/]+)", _Hub)], asked=asked)
    server = HTTPServer(app)
    sock = __import__("socket").socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    server.add_sockets([sock])
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/hub/api", asked
    server.stop()


class _Log:
    def __init__(self):
        self.lines: list[str] = []

    def info(self, msg, *args):
        self.lines.append(msg % args)

    warning = info


async def test_the_client_asks_with_the_persons_token_caches_briefly_and_never_blocks(hub_api):
    url, asked = hub_api
    log = _Log()
    client = deliver.SecretsClient(url, "alice", "vision", log)
    got = await client.delivery_for("owner-token", "alice")
    assert got.env == {"HF_TOKEN": VALUE} and got.problem == ""
    assert asked[0][:2] == ("alice", "vision")
    assert asked[0][2]["Authorization"] == "token owner-token"
    assert (await client.delivery_for("owner-token", "alice")).env == got.env
    assert len(asked) == 1  # cached
    client._cache = {k: (t - deliver.CACHE_S, d) for k, (t, d) in client._cache.items()}
    await client.delivery_for("owner-token", "alice")
    assert len(asked) == 2  # never longer than CACHE_S

    refused = await client.delivery_for("viewer-token", "vic")
    assert refused.env == {} and "answered 403: Only the project's owner" in refused.problem
    no_token = await client.delivery_for("", "vic")
    assert no_token.problem == "the request that started it carried no token"
    gone = deliver.SecretsClient("http://127.0.0.1:9/hub/api", "alice", "vision", log)
    down = await gone.delivery_for("owner-token", "alice")
    assert down.env == {} and "gpulab's hub did not answer" in down.problem
    assert all(VALUE not in line for line in log.lines)
    assert any("starts without secrets" in line for line in log.lines)


async def test_a_kernel_gets_the_secrets_of_who_started_or_restarted_it_and_no_other():
    from gpulab_jupyter.secrets.kernels import SecretsKernelManager

    km = SecretsKernelManager()
    started = []
    try:
        token = deliver.current.set(deliver.Delivery("alice", {"HF_TOKEN": VALUE}))
        try:
            started.append(await km.start_kernel(kernel_name="python3"))
        finally:
            deliver.current.reset(token)
        started.append(await km.start_kernel(kernel_name="python3"))

        def environ(kernel_id) -> dict[str, str]:
            pid = km.get_kernel(kernel_id).provisioner.process.pid
            raw = Path(f"/proc/{pid}/environ").read_bytes()
            return dict(e.split("=", 1) for e in raw.decode().split("\0") if "=" in e)

        mine, other = environ(started[0]), environ(started[1])
        assert mine["HF_TOKEN"] == VALUE and mine["GPULAB_SECRET_NAMES"] == "HF_TOKEN"
        assert mine["GPULAB_STARTED_BY"] == "alice"
        assert "HF_TOKEN" not in other and "GPULAB_SECRET_NAMES" not in other
        assert "HF_TOKEN" not in os.environ  # the server's own environment never gets them

        # Someone restarts it: it gets their secrets as they are now, nothing of before.
        token = deliver.current.set(deliver.Delivery("bob", {}))
        try:
            await km.restart_kernel(started[0])
        finally:
            deliver.current.reset(token)
        renewed = environ(started[0])
        assert "HF_TOKEN" not in renewed and renewed["GPULAB_SECRET_NAMES"] == ""
        assert renewed["GPULAB_STARTED_BY"] == "bob"
        token = deliver.current.set(deliver.Delivery("alice", {"HF_TOKEN": VALUE + "2"}))
        try:
            await km.restart_kernel(started[0])
        finally:
            deliver.current.reset(token)
        assert environ(started[0])["HF_TOKEN"] == VALUE + "2"
        await km.restart_kernel(started[0])  # by itself (no request): keeps what it had
        assert environ(started[0])["HF_TOKEN"] == VALUE + "2"
    finally:
        await km.shutdown_all(now=True)
        # Its zmq context ends here, on this test's loop: left to the garbage collector,
        # MultiKernelManager.__del__ ended it in whatever test ran then, and its
        # Context.term waited there for ever (a whole run hung in test_serverready.py).
        km.context.destroy(linger=0)


def test_a_terminal_gets_the_secrets_of_who_opened_it():
    from jupyter_server_terminals.terminalmanager import TerminalManager

    from gpulab_jupyter.secrets.terminals import deliver_to_terminals

    manager = TerminalManager(shell_command=["/bin/sh"])
    settings = {"terminal_manager": manager}
    assert deliver_to_terminals(settings) is True
    assert deliver_to_terminals(settings) is False  # once
    assert isinstance(manager, TerminalManager)
    assert "HF_TOKEN" not in manager.make_term_env()
    token = deliver.current.set(deliver.Delivery("alice", {"HF_TOKEN": VALUE}))
    try:
        env = manager.make_term_env()
    finally:
        deliver.current.reset(token)
    assert env["HF_TOKEN"] == VALUE and env["TERM"] and env["GPULAB_SECRET_NAMES"] == "HF_TOKEN"


def test_a_job_gets_the_secrets_it_was_started_with(tmp_path):
    from gpulab_jupyter.jobs.local import LocalEngine
    from gpulab_jupyter.jobs.model import JobRequest

    (tmp_path / "show.py").write_text(
        "import hashlib, os\n"
        "print(hashlib.sha256(os.environ.get('HF_TOKEN', 'absent').encode()).hexdigest())\n"
        "print(os.environ.get('GPULAB_SECRET_NAMES'))\n"
    )
    engine = LocalEngine(tmp_path)
    extra = deliver.Delivery("alice", {"HF_TOKEN": VALUE}).additions()
    job = engine.start(JobRequest("show.py"), extra)
    deadline = time.monotonic() + 30
    while engine.status(job.id).state not in ("succeeded", "failed"):
        assert time.monotonic() < deadline, engine.logs(job.id)
        time.sleep(0.1)
    out = engine.logs(job.id).splitlines()
    assert hashlib.sha256(VALUE.encode()).hexdigest() in out and "HF_TOKEN" in out
    # Its record holds no value.
    assert VALUE not in (tmp_path / "jobs" / job.id / "job.json").read_text()
    rerun = engine.rerun(job.id)  # re-run without a delivery: nothing of the first
    while engine.status(rerun.id).state not in ("succeeded", "failed"):
        time.sleep(0.1)
    assert hashlib.sha256(b"absent").hexdigest() in engine.logs(rerun.id).splitlines()


# --- what a user reads in a kernel --------------------------------------------------------
PROJECT_ENV = {
    "JUPYTERHUB_USER": "alice",
    "JUPYTERHUB_SERVER_NAME": "vision",
    "JUPYTERHUB_BASE_URL": "/",
}


@pytest.fixture
def kernel_env(monkeypatch):
    for name in ("HF_TOKEN", "GPULAB_SECRET_NAMES", "GPULAB_SECRETS_PROBLEM", "GPULAB_STARTED_BY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in PROJECT_ENV.items():
        monkeypatch.setenv(name, value)
    return monkeypatch


def test_get_reads_a_given_secret_and_says_what_to_do_when_one_is_missing(kernel_env):
    kernel_env.setenv("HF_TOKEN", VALUE)
    kernel_env.setenv("GPULAB_SECRET_NAMES", "HF_TOKEN")
    kernel_env.setenv("GPULAB_STARTED_BY", "alice")
    assert user_secrets.get("HF_TOKEN") == VALUE and user_secrets.names() == ["HF_TOKEN"]
    with pytest.raises(user_secrets.MissingSecret) as missing:
        user_secrets.get("WANDB_API_KEY")
    assert str(missing.value) == (
        "WANDB_API_KEY is not one of the secrets this kernel got: add it on the Secrets page "
        "(/hub/gpulab/secrets), choose it for project vision, then restart the kernel."
    )
    assert user_secrets.get("WANDB_API_KEY", None) is None
    kernel_env.delenv("HF_TOKEN")
    with pytest.raises(user_secrets.MissingSecret, match="code running in it has removed it"):
        user_secrets.get("HF_TOKEN")


def test_get_tells_a_collaborator_and_a_kernel_without_secrets_why(kernel_env):
    kernel_env.setenv("GPULAB_SECRET_NAMES", "")
    kernel_env.setenv("GPULAB_STARTED_BY", "bob")
    kernel_env.setenv("JUPYTERHUB_PUBLIC_HUB_URL", "https://lab.example.org/hub/")
    kernel_env.setenv("HF_TOKEN", "set by code, not by gpulab")
    with pytest.raises(user_secrets.MissingSecret) as missing:
        user_secrets.get("HF_TOKEN")
    said = str(missing.value)
    assert "kernels that collaborators start get alice's secrets only where alice allows it" in said
    assert "https://lab.example.org/hub/gpulab/secrets" in said
    kernel_env.delenv("GPULAB_SECRET_NAMES")
    kernel_env.delenv("HF_TOKEN")
    kernel_env.setenv("GPULAB_SECRETS_PROBLEM", "gpulab's hub did not answer (TimeoutError)")
    with pytest.raises(user_secrets.MissingSecret, match="started without your secrets"):
        user_secrets.get("HF_TOKEN")


# --- the hub's configuration --------------------------------------------------------------
def test_the_hub_is_configured_without_writing_and_names_the_kernel_manager(tmp_path, monkeypatch):
    from gpulab_hub import hubconfig, secrets
    from gpulab_jupyter.secrets.kernels import SecretsKernelManager

    monkeypatch.delenv(crypt.KEY_ENV, raising=False)
    c = Config()
    hubconfig.apply(c, {"GPULAB_HOME": str(tmp_path)}, images_dir="images")
    hub = tmp_path / "hub"
    assert not (hub / "crypt-key").exists() and not (hub / "secrets").exists()  # no writes
    assert "keys" not in c.CryptKeeper  # no key yet: secrets are off, the hub starts
    kernel_managers = [a for a in c.Spawner.args if "kernel_manager_class" in a]
    assert kernel_managers == [f"--ServerApp.kernel_manager_class={secrets.KERNEL_MANAGER_CLASS}"]
    assert secrets.KERNEL_MANAGER_CLASS == (
        f"{SecretsKernelManager.__module__}.{SecretsKernelManager.__qualname__}"
    )
    crypt.ensure_key(hub, environ={})  # what jupyterhub_config.py does first
    c = Config()
    hubconfig.apply(c, {"GPULAB_HOME": str(tmp_path)}, images_dir="images")
    assert c.CryptKeeper["keys"] == crypt.read_keys(hub)
