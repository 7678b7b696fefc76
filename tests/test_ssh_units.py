"""The SSH gateway's parts that need no hub: login limits, Docker's stream taken apart,
what is taken from clients (TERM, sizes, environment, forward targets) and from the
hub's answers, the session log and the host key. The gateway against a real hub and
OpenSSH's client: test_ssh_gateway.py."""

from __future__ import annotations

import json
import os
import struct

import pytest

from gpulab_hub.ssh import audit, checks, hostkey, limits
from gpulab_hub.ssh.dockerexec import STDERR, STDOUT, Demux
from gpulab_hub.ssh.gateway import Settings, token_may_log_in


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


# --- login limits --------------------------------------------------------------------


def test_wrong_tokens_lock_the_account_for_passwords_only_and_only_that_account():
    clock = Clock()
    lim = limits.Limiter(limits.Limits(user_failures=3, ip_failures=100, lockout_s=300), clock)
    for _ in range(2):
        lim.password_failed("10.0.0.1", "mallory-target")
    assert lim.password_locked("10.0.0.1", "mallory-target") == 0
    lim.password_failed("10.0.0.1", "mallory-target")
    # locked for passwords, from any address; the address itself is not
    assert lim.password_locked("10.0.0.1", "mallory-target") == 300
    assert lim.password_locked("10.9.9.9", "mallory-target") == 300
    assert lim.address_locked("10.0.0.1") == 0
    assert lim.password_locked("10.0.0.1", "someone-else") == 0
    clock.now += 299
    assert lim.password_locked("10.0.0.1", "mallory-target") == pytest.approx(1)
    clock.now += 2
    assert lim.password_locked("10.0.0.1", "mallory-target") == 0


def test_failures_outside_the_window_do_not_count_and_success_clears_the_account():
    clock = Clock()
    lim = limits.Limiter(limits.Limits(user_failures=3, ip_failures=100, window_s=60), clock)
    lim.password_failed("10.0.0.1", "bob")
    lim.password_failed("10.0.0.1", "bob")
    clock.now += 61
    lim.password_failed("10.0.0.1", "bob")
    assert lim.password_locked("10.0.0.1", "bob") == 0
    lim.password_failed("10.0.0.1", "bob")
    lim.password_succeeded("bob")
    lim.password_failed("10.0.0.1", "bob")
    assert lim.password_locked("10.0.0.1", "bob") == 0


def test_an_address_with_many_failed_logins_is_locked_for_everything():
    clock = Clock()
    lim = limits.Limiter(limits.Limits(user_failures=100, ip_failures=4, lockout_s=120), clock)
    for _ in range(3):
        lim.login_failed("192.0.2.7")
    lim.password_failed("192.0.2.7", None)
    assert lim.address_locked("192.0.2.7") == 120
    assert lim.password_locked("192.0.2.7", "anyone") == 120
    assert lim.address_locked("192.0.2.8") == 0


def test_limiter_memory_is_bounded(monkeypatch):
    monkeypatch.setattr(limits, "MAX_TRACKED", 10)
    lim = limits.Limiter(limits.Limits(ip_failures=1000), Clock())
    for n in range(50):
        lim.login_failed(f"10.0.0.{n}")
    assert len(lim._failures) <= 10


def test_lockout_words_and_settings():
    assert limits.lockout_message(61).startswith("Too many failed logins")
    assert limits.lockout_message(61).endswith("Try again in 2 minutes.")
    assert limits.lockout_message(5).endswith("Try again in 1 minute.")
    from gpulab_hub import settings

    got = limits.Limits.of(
        settings.parse({"GPULAB_LOGIN_ATTEMPTS": "7", "GPULAB_LOGIN_LOCKOUT_SECONDS": "60"})
    )
    assert (got.user_failures, got.lockout_s, got.ip_failures) == (7, 60, 30)
    for bad in ("-1", "1e3", "five", "9" * 12, "1001"):
        with pytest.raises(ValueError, match="GPULAB_LOGIN_ATTEMPTS"):
            settings.parse({"GPULAB_LOGIN_ATTEMPTS": bad})


def test_login_attempts_0_never_locks_an_account_over_ssh_as_on_the_login_page():
    """GPULAB_LOGIN_ATTEMPTS=0 is documented as "never locked": the hub starts with it
    (the gateway's limits once refused it, so the hub did not), and wrong tokens for one
    account do not lock it; the address lockout still counts them."""
    from traitlets.config import Config

    from gpulab_hub import hubconfig, settings

    c = Config()
    hubconfig.apply(c, {"GPULAB_LOGIN_ATTEMPTS": "0", "GPULAB_HUB_IP": "127.0.0.1"}, "/i")
    (gw,) = [s for s in c.JupyterHub.services if s["name"] == "gpulab-ssh"]
    lim = limits.Limiter(limits.Limits.of(settings.of_service(gw["environment"])), Clock())
    for _ in range(29):
        lim.password_failed("10.0.0.9", "alice")
    assert lim.password_locked("10.0.0.8", "alice") == 0  # the account: never locked
    lim.password_failed("10.0.0.9", "alice")
    assert lim.address_locked("10.0.0.9") > 0  # the address: its 30th failure


# --- Docker's multiplexed stream -------------------------------------------------------


def frame(stream: int, data: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(data)) + data


def joined(pieces):
    out = {STDOUT: b"", STDERR: b""}
    for stream, data in pieces:
        out[stream] += data
    return out


def test_demux_whole_frames_and_every_split_point():
    stream = frame(1, b"hello ") + frame(2, b"oops\n") + frame(1, b"world\n") + frame(3, b"!")
    whole = joined(Demux().feed(stream))
    assert whole == {STDOUT: b"hello world\n", STDERR: b"oops\n!"}
    for cut in range(1, len(stream)):
        d = Demux()
        assert joined(d.feed(stream[:cut]) + d.feed(stream[cut:])) == whole
        assert d.idle
    d = Demux()
    pieces = [p for i in range(len(stream)) for p in d.feed(stream[i : i + 1])]
    assert joined(pieces) == whole


def test_demux_passes_a_big_frame_on_as_it_comes():
    d = Demux()
    big = frame(1, b"x" * 100_000)
    first = d.feed(big[:1000])
    assert first == [(STDOUT, b"x" * 992)] and not d.idle
    assert joined(d.feed(big[1000:]))[STDOUT] == b"x" * (100_000 - 992)
    assert d.idle


# --- what clients send ----------------------------------------------------------------


def test_terminal_type_full_match_or_default():
    for ok in ("xterm-256color", "screen.xterm-256color", "vt100", "xterm+256"):
        assert checks.terminal_type(ok) == ok
    for bad in ("", None, "xterm\n", "xterm;rm -rf /", "../../etc/passwd", "x" * 65, "é"):
        assert checks.terminal_type(bad) == checks.DEFAULT_TERM


def test_window_size_bounds():
    assert checks.window_size(80, 24) == (80, 24)
    assert checks.window_size(10**9, 10**9) == (checks.MAX_COLUMNS, checks.MAX_ROWS)
    assert checks.window_size(0, 24) is None
    assert checks.window_size(-1, 5) is None
    assert checks.window_size("80", 24) is None


def test_client_environment_keeps_locale_names_only():
    sent = {
        "LANG": "en_US.UTF-8",
        "LC_ALL": "C.UTF-8",
        "LD_PRELOAD": "/tmp/evil.so",
        "PATH": "/tmp",
        "BASH_ENV": "/tmp/x",
        "LC_CTYPE": "$(reboot)",
        "JUPYTERHUB_API_TOKEN": "x",
        b"LC_TIME": b"de_DE.UTF-8",
    }
    assert checks.client_env(sent) == {
        "LANG": "en_US.UTF-8",
        "LC_ALL": "C.UTF-8",
        "LC_TIME": "de_DE.UTF-8",
    }
    many = {f"LC_{chr(65 + n % 26)}{chr(65 + n // 26)}": "C" for n in range(40)}
    assert len(checks.client_env(many)) == checks.MAX_ENV


def test_forward_targets_are_the_containers_own_loopback_only():
    assert checks.forward_target("localhost", 8888) == ("127.0.0.1", 8888)
    assert checks.forward_target("127.0.0.1", 1) == ("127.0.0.1", 1)
    assert checks.forward_target("::1", 65535) == ("::1", 65535)
    refused = [
        ("10.0.0.5", 22),
        ("172.17.0.1", 8081),
        ("hub", 8081),
        ("LOCALHOST ", 80),
        ("localhost.", 80),
        ("127.0.0.2", 80),
        ("0.0.0.0", 80),
        ("127.1", 80),
        ("localhost", 0),
        ("localhost", 65536),
        ("localhost", True),
        ("localhost", "80"),
        (None, 80),
    ]
    for host, port in refused:
        assert checks.forward_target(host, port) is None, (host, port)


def test_socket_paths():
    ok = "/home/jovyan/.vscode-server/data/vscode-b0c1-4f2e.sock"
    assert checks.socket_path(ok) == ok
    assert checks.socket_path("/tmp/x.sock") == "/tmp/x.sock"
    for bad in (
        "relative.sock",
        "/tmp/../etc/x",
        "/tmp/./x",
        "//x",
        "/tmp/x\0y",
        "/tmp/x y",
        "/" + "a" * 120,
        "",
        None,
    ):
        assert checks.socket_path(bad) is None, bad


def test_commands():
    assert checks.command_ok("python -c 'print(1)'")
    assert not checks.command_ok("")
    assert not checks.command_ok("a\0b")
    assert not checks.command_ok("x" * (checks.MAX_COMMAND + 1))


# --- the hub's answers -------------------------------------------------------------------


def answer(**over):
    base = {
        "role": "owner",
        "exists": True,
        "running": True,
        "pending": None,
        "can_start": True,
        "container": "gpulab-alice-one",
        "exec_user": "1000:100",
        "workdir": "/workspace",
        "url": "/user/alice/one/lab",
        "prefix": "gpulab",
        "message": "",
    }
    return {**base, **over}


def test_decide_running_project_for_owner_and_collaborator():
    d = checks.decide(answer(), "alice", "one")
    assert (d.action, d.container, d.exec_user, d.workdir) == (
        "go",
        "gpulab-alice-one",
        "1000:100",
        "/workspace",
    )
    assert checks.decide(answer(role="collaborator"), "alice", "one").action == "go"


def test_decide_refuses_viewers_strangers_and_unusable_answers():
    viewer = checks.decide(answer(role="viewer", message="You are a viewer."), "alice", "one")
    assert viewer == checks.Decision("refuse", "You are a viewer.")
    assert "not run code" in checks.decide(answer(role="viewer"), "alice", "one").message
    stranger = checks.decide(answer(role="", exists=False, container=""), "alice", "one")
    unknown = checks.decide(answer(role="", exists=True), "alice", "one")
    assert stranger.action == unknown.action == "refuse"
    assert stranger.message == unknown.message  # the same words: nothing is revealed
    for bad in (
        answer(exec_user="0:0"),
        answer(exec_user="0:100"),
        answer(exec_user="root"),
        answer(exec_user="1000:100 "),
        answer(container="../x"),
        answer(container="a b"),
        answer(role="admin"),
        None,
        [],
    ):
        assert checks.decide(bad, "alice", "one").action == "refuse", bad
    assert checks.decide(answer(workdir="/etc/../root"), "alice", "one").workdir == "/workspace"


def test_decide_stopped_projects():
    assert checks.decide(answer(running=False), "alice", "one").action == "start"
    assert checks.decide(answer(running=False, pending="spawn"), "alice", "one").action == "wait"
    cannot = checks.decide(answer(role="collaborator", running=False, can_start=False), "a", "p")
    assert cannot.action == "refuse"
    assert "/user/alice/one/lab" in cannot.message and "not running" in cannot.message


def test_hub_words_reach_terminals_without_escape_sequences():
    d = checks.decide(answer(role="", message="no \x1b[2Jproject\x07 \u202eevil"), "a", "p")
    assert "\x1b" not in d.message and "\x07" not in d.message and "\u202e" not in d.message
    assert d.message.startswith("no  [2Jproject")


def test_only_a_users_own_full_token_logs_in_by_password():
    mine = {"kind": "user", "name": "alice", "scopes": ["servers!user=alice", "read:users"]}
    assert token_may_log_in(mine, "alice")
    assert not token_may_log_in(mine, "bob")
    # a project server's own token (readable by everyone who runs code in it)
    server = {
        "kind": "user",
        "name": "alice",
        "scopes": ["access:servers!server=alice/one", "users:activity!user=alice"],
    }
    assert not token_may_log_in(server, "alice")
    service = {"kind": "service", "name": "alice", "scopes": ["servers"]}
    assert not token_may_log_in(service, "alice")
    assert not token_may_log_in(None, "alice")
    assert not token_may_log_in({"name": "alice", "scopes": "servers"}, "alice")


def test_secrets_env_keeps_checked_names_and_values():
    got = checks.secrets_env(
        {"env": {"WANDB_API_KEY": "abc", "BAD NAME": "x", "NUL": "a\0b", "N": 5, "_OK": ""}}
    )
    assert got == {"WANDB_API_KEY": "abc", "_OK": ""}
    assert checks.secrets_env(None) == {} and checks.secrets_env({"env": []}) == {}


def test_settings_from_the_services_environment(tmp_path):
    from gpulab_hub import settings

    site = settings.parse({"GPULAB_HOME": str(tmp_path), "GPULAB_SSH_BIND": "127.0.0.1"})
    env = {
        **settings.service_env(site),
        "JUPYTERHUB_API_URL": "http://127.0.0.1:8081/hub/api",
        "JUPYTERHUB_API_TOKEN": "t" * 32,
    }
    s = Settings.from_env(env)
    assert (s.port, s.prefix, s.recheck_s, s.bind) == (2222, "gpulab", 15.0, "127.0.0.1")
    assert s.host_key == tmp_path / "hub" / "ssh" / "host_ed25519_key"
    with pytest.raises(ValueError, match="JUPYTERHUB_API_TOKEN"):
        Settings.from_env({**env, "JUPYTERHUB_API_TOKEN": ""})
    with pytest.raises(ValueError, match="GPULAB_SETTINGS"):
        Settings.from_env({k: v for k, v in env.items() if k != "GPULAB_SETTINGS"})
    with pytest.raises(ValueError, match="GPULAB_SSH_PORT"):
        settings.parse({"GPULAB_SSH_PORT": "70000"})


# --- the session log and the host key ------------------------------------------------------


def test_audit_lines_are_json_scalars_and_the_log_is_private(tmp_path):
    path = tmp_path / "sessions.log"
    lines = []

    class Out:
        def write(self, s):
            lines.append(s)

        def flush(self):
            pass

    log = audit.Audit(str(path), Out())
    log.event("session-end", user="alice", note="x\ny" * 200, nested={"a": 1}, n=3)
    log.close()
    record = json.loads(path.read_text())
    assert record["event"] == "session-end" and record["n"] == 3
    assert len(record["note"]) == audit.MAX_STRING and record["nested"] == "{'a': 1}"
    assert path.read_text().count("\n") == 1 and lines and "\n" not in lines[0].rstrip("\n")
    assert (path.stat().st_mode & 0o777) == 0o600


def test_audit_never_writes_through_a_link(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / "sessions.log").symlink_to(target)
    errors = []

    class Out:
        def write(self, s):
            errors.append(s)

        def flush(self):
            pass

    log = audit.Audit(str(tmp_path / "sessions.log"), Out())
    log.event("connect")
    assert target.read_text() == ""
    assert any("cannot write the session log" in e for e in errors)


def test_host_key_made_once_kept_and_private(tmp_path):
    path = tmp_path / "ssh" / "host_ed25519_key"
    key = hostkey.load_or_make(path)
    assert (path.stat().st_mode & 0o777) == 0o600
    pub = path.with_name(path.name + ".pub").read_text()
    assert pub.startswith("ssh-ed25519 ")
    again = hostkey.load_or_make(path)
    assert hostkey.fingerprint(again) == hostkey.fingerprint(key)
    os.chmod(path, 0o644)
    with pytest.raises(hostkey.HostKeyError, match="0600"):
        hostkey.load_or_make(path)


def test_host_key_link_is_refused(tmp_path):
    real = tmp_path / "real"
    hostkey.load_or_make(real)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(hostkey.HostKeyError, match="link"):
        hostkey.load_or_make(link)


# --- connections not logged in yet ------------------------------------------------------------


async def test_an_address_opens_at_most_ten_connections_not_logged_in_at_once(tmp_path):
    import asyncio

    import asyncssh

    from gpulab_hub.ssh import gateway

    settings = Settings(
        bind="127.0.0.1",
        port=1,
        host_key=tmp_path / "key",
        keys_dir=tmp_path / "keys",
        log="",
        prefix="gpulab",
        api_url="http://127.0.0.1:9/hub/api",
        api_token="t" * 32,
        limits=limits.Limits(),
    )
    gw = gateway.Gateway(settings, docker=None, hub=None, audit=audit.Audit(None, _Quiet()))
    server = await asyncssh.create_server(
        lambda: gateway.Connection(gw),
        "127.0.0.1",
        0,
        server_host_keys=[hostkey.load_or_make(settings.host_key)],
    )
    port = server.sockets[0].getsockname()[1]
    opened = []
    try:
        for _ in range(gateway.MAX_LOGGING_IN + 1):
            opened.append(await asyncio.open_connection("127.0.0.1", port))
        await asyncio.sleep(0.3)

        async def closed(reader) -> bool:
            try:
                while await asyncio.wait_for(reader.read(4096), 1):
                    pass
            except TimeoutError:
                return False
            return True

        assert await closed(opened[-1][0])  # the eleventh: closed at once
        assert not await closed(opened[0][0])  # the others wait for their login
    finally:
        for _, writer in opened:
            writer.close()
        server.close()


class _Quiet:
    def write(self, s):
        pass

    def flush(self):
        pass


def test_the_address_lockout_settings_reach_the_gateway():
    """GPULAB_SSH_IP_ATTEMPTS and GPULAB_SSH_FAILURE_WINDOW, documented for the site,
    are in the gateway service's environment and become its limits; out of range, the
    hub does not start and says which."""
    from traitlets.config import Config

    from gpulab_hub import hubconfig

    hub_api = {"JUPYTERHUB_API_URL": "http://127.0.0.1:8081/hub/api", "JUPYTERHUB_API_TOKEN": "t"}

    def gateway_limits(**site) -> limits.Limits:
        c = Config()
        hubconfig.apply(c, {"GPULAB_HUB_IP": "127.0.0.1", **site}, images_dir="/i")
        (gw,) = [s for s in c.JupyterHub.services if s["name"] == "gpulab-ssh"]
        return Settings.from_env({**gw["environment"], **hub_api}).limits

    got = gateway_limits(GPULAB_SSH_IP_ATTEMPTS="7", GPULAB_SSH_FAILURE_WINDOW="120")
    assert (got.ip_failures, got.window_s) == (7, 120)
    default = gateway_limits()
    assert (default.ip_failures, default.window_s) == (30, 600)
    with pytest.raises(ValueError, match="GPULAB_SSH_IP_ATTEMPTS must be a whole number"):
        gateway_limits(GPULAB_SSH_IP_ATTEMPTS="lots")
