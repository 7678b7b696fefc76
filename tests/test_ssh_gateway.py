"""SSH into projects, as users do it: Debian's OpenSSH client (ssh, scp, sftp) against
the gateway that `gpulab up` started with the session hub (docs/remote.md).

People: an owner with one project, a collaborator (whose share is later revoked), a
viewer, another user, and a user whose hub token is guessed at until the gateway
locks it. Their keys are added on the hub's SSH page, as users add them. The host key
is pinned in known_hosts from the gateway's public key file (StrictHostKeyChecking),
its fingerprint checked against the one the SSH page shows.

One project start: the owner's first ssh finds the project stopped and starts it
(progress on stderr); every later check reuses that running project. Tests run in
file order. On failure, the hub log's tail and the gateway's session log are printed.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests
from conftest import free_port
from security.people import log_in_admin, make_user, page_post

from gpulab_hub import ssh
from gpulab_hub.projects import objects
from gpulab_hub.sharing import REVOKE_WITHIN_S

pytestmark = [pytest.mark.docker]

OWNER, PROJECT = "sshowner", "one"
COLLAB, VIEWER, OTHER, LOCKED = "sshcollab", "sshviewer", "sshother", "sshlocked"
VENV = "/opt/gpulab/venv"
NOTEBOOK_UID = 1000


# --- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def where(hub):
    return ssh.paths(hub.home / "hub")


@pytest.fixture(autouse=True)
def show_gateway_log_on_failure(request, show_logs_on_failure, where):
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        log = where["log"]
        text = log.read_text(errors="replace") if log.exists() else "(no session log)"
        print("\n----- SSH gateway session log (last 40 lines) -----")
        print("\n".join(text.splitlines()[-40:]))


@pytest.fixture(scope="module")
def people(hub):
    admin = log_in_admin(hub)
    return {n: make_user(hub, admin, n) for n in (OWNER, COLLAB, VIEWER, OTHER, LOCKED)}


@pytest.fixture(scope="module")
def keys(tmp_path_factory, people):
    """An ed25519 key pair per person, the public half added on the hub's SSH page."""
    folder = tmp_path_factory.mktemp("sshkeys")
    made = {}
    for name, user in people.items():
        key = folder / name
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{name}@laptop", "-f", key],
            check=True,
        )
        xsrf = user.http.cookies.get("_xsrf", path="/hub/") or ""
        page = user.http.post(
            f"{user.base}/hub/gpulab/ssh",
            data={"_xsrf": xsrf, "action": "add", "key": key.with_suffix(".pub").read_text()},
            timeout=30,
        )
        assert page.status_code == 200 and "Added your ssh-ed25519 key" in page.text, page.text
        made[name] = key
    return made


@pytest.fixture(scope="module")
def known_hosts(hub, where, people, tmp_path_factory):
    """known_hosts pinning the gateway's host key, whose fingerprint the SSH page shows."""
    pub = where["host_key"].with_name(where["host_key"].name + ".pub")
    deadline = time.monotonic() + 30
    while not pub.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert pub.exists(), "the gateway wrote no host key"
    assert (where["host_key"].stat().st_mode & 0o777) == 0o600
    listed = subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True)
    fingerprint = listed.stdout.split()[1]
    assert fingerprint.startswith("SHA256:")
    page = people[OWNER].http.get(f"{hub.url}/hub/gpulab/ssh", timeout=30)
    assert fingerprint in page.text, "the SSH page does not show the gateway's fingerprint"
    path = tmp_path_factory.mktemp("known") / "known_hosts"
    path.write_text(f"[127.0.0.1]:{hub.env['GPULAB_SSH_PORT']} {pub.read_text().strip()}\n")
    return path


class Client:
    """Debian's OpenSSH client with one key, the pinned host key and no user config."""

    def __init__(self, hub, known_hosts: Path, key: Path | None):
        self.port = hub.env["GPULAB_SSH_PORT"]
        self.key = key
        self.options = [
            "-F", "/dev/null",
            "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "IdentitiesOnly=yes",
            "-o", "ConnectTimeout=20",
        ]  # fmt: skip
        if key is not None:
            self.options += ["-i", str(key), "-o", "BatchMode=yes"]

    def command(self, login: str, options, command: str | None) -> list[str]:
        cmd = ["ssh", "-p", self.port, *self.options, *options, f"{login}@127.0.0.1"]
        return cmd if command is None else [*cmd, command]

    def ssh(self, login: str, command: str | None, *options: str, input=None, env=None):
        """Run ``ssh [options] login@host [command]``; the completed process (text)."""
        return subprocess.run(
            self.command(login, options, command),
            input=input, capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip

    def popen(self, login: str, command: str | None, *options: str) -> subprocess.Popen:
        return subprocess.Popen(
            self.command(login, options, command), stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )


@pytest.fixture(scope="module")
def clients(hub, keys, known_hosts):
    return {name: Client(hub, known_hosts, key) for name, key in keys.items()}


@pytest.fixture(scope="module")
def started(hub, people, clients):
    """The owner's project, made (one start through the API) and stopped; then the
    owner's first ssh starts it again. That ssh's result, for the first test."""
    owner = people[OWNER]
    owner.start_project(PROJECT)
    owner.stop_project(PROJECT)
    t0 = time.monotonic()
    done = clients[OWNER].ssh(
        f"{OWNER}+{PROJECT}", "id -un; id -u; pwd; command -v python; echo $VIRTUAL_ENV"
    )
    print(f"\nssh started the stopped project in {time.monotonic() - t0:.1f} s; its stderr:")
    print(done.stderr)
    yield done
    if PROJECT in owner.api("GET", f"/hub/api/users/{OWNER}").json()["servers"]:
        owner.stop_project(PROJECT)


def session_log(where) -> list[dict]:
    return [json.loads(line) for line in where["log"].read_text().splitlines() if line]


# --- the owner: start, shell, commands, files, forwards ---------------------------------------


def test_ssh_starts_the_stopped_project_and_lands_in_it_as_the_notebook_user(started):
    assert started.returncode == 0, started.stderr
    assert f"gpulab: starting project {PROJECT} …" in started.stderr
    lead = f"gpulab: starting project {PROJECT} … "
    progress = [line for line in started.stderr.splitlines() if line.startswith(lead)]
    # the project's own progress messages (as on the spawn page), one a line
    assert f"{lead}Preparing project {PROJECT}" in progress, started.stderr
    assert f"gpulab: project {PROJECT} is running." in started.stderr
    assert started.stdout.split("\n")[:5] == [
        "jovyan",
        str(NOTEBOOK_UID),
        "/workspace",
        f"{VENV}/bin/python",
        VENV,
    ]


def test_commands_pass_their_exit_status_and_read_a_script_on_stdin(started, clients):
    c = clients[OWNER]
    login = f"{OWNER}+{PROJECT}"
    assert c.ssh(login, "exit 7").returncode == 7
    py = c.ssh(login, "python -c 'import sys; print(sys.prefix); sys.exit(3)'")
    assert (py.returncode, py.stdout.strip()) == (3, VENV)
    # What VS Code's Remote-SSH does: `ssh host bash` with its script on stdin.
    script = "echo from-the-script $((6 * 7))\nexport X=kept\necho $X\nexit 5\n"
    done = c.ssh(login, "bash", "-T", input=script)
    assert done.returncode == 5, done.stderr
    assert done.stdout.split() == ["from-the-script", "42", "kept"]


def test_interactive_shell_is_a_login_bash_in_a_pseudo_terminal(started, clients):
    def shell(term: str):
        done = clients[OWNER].ssh(
            f"{OWNER}+{PROJECT}",
            None,
            "-tt",
            input="echo shell=$0; tty; shopt login_shell; echo term=$TERM; exit 3\n",
            env={**os.environ, "TERM": term},
        )
        assert done.returncode == 3, done.stderr
        return done.stdout.replace("\r", "")

    out = shell("vt100")
    assert re.search(r"^shell=(/bin/)?-?bash$", out, re.M), out
    assert re.search(r"^/dev/pts/\d+$", out, re.M), out
    assert re.search(r"^login_shell\s+on$", out, re.M), out
    assert re.search(r"^term=vt100$", out, re.M), out
    # a terminal type that is no terminal's name is not passed on
    assert re.search(r"^term=xterm-256color$", shell("vt100;touch /tmp/x"), re.M)


def test_terminal_follows_window_size_and_is_hung_up_when_the_client_goes(
    hub, started, clients, keys, known_hosts
):
    import asyncio

    import asyncssh

    async def resize_and_drop() -> str:
        async with asyncssh.connect(
            "127.0.0.1",
            int(hub.env["GPULAB_SSH_PORT"]),
            username=f"{OWNER}+{PROJECT}",
            client_keys=[str(keys[OWNER])],
            known_hosts=str(known_hosts),
            agent_path=None,
        ) as conn:
            proc = await conn.create_process(term_type="xterm", term_size=(100, 30))

            async def answer(name: str) -> str:
                """The value the shell printed as ``<name>=<value>`` (not its echo)."""
                while True:
                    line = await asyncio.wait_for(proc.stdout.readline(), 20)
                    m = re.search(rf"(?<![$(])\b{name}=([0-9 ]+)\r?$", line)
                    if m and "echo" not in line:
                        return m[1]

            proc.stdin.write("echo size=$(stty size)\n")
            assert await answer("size") == "30 100"
            proc.change_terminal_size(120, 40)
            await asyncio.sleep(0.5)
            proc.stdin.write("echo size=$(stty size)\n")
            assert await answer("size") == "40 120"
            proc.stdin.write("echo pid=$$\n")
            return await answer("pid")
        # leaving the block drops the connection without "exit"

    pid = asyncio.run(resize_and_drop())
    assert pid.isdigit()
    check = f"kill -0 {pid} 2>/dev/null && echo alive || echo gone"
    deadline = time.monotonic() + 15
    while clients[OWNER].ssh(f"{OWNER}+{PROJECT}", check).stdout.strip() != "gone":
        assert time.monotonic() < deadline, "the shell of a dropped connection still runs"
        time.sleep(0.5)


def test_scp_and_sftp_copy_files_in_and_out(hub, started, clients, tmp_path, docker_engine):
    c = clients[OWNER]
    login = f"{OWNER}+{PROJECT}"
    payload = os.urandom(300_000) + b"end"
    src = tmp_path / "data.bin"
    src.write_bytes(payload)
    common = ["-P", c.port, *c.options]
    up = subprocess.run(
        ["scp", *common, str(src), f"{login}@127.0.0.1:data.bin"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    on_host = hub.home / "projects" / OWNER / PROJECT / "data.bin"
    assert on_host.read_bytes() == payload
    uid_off, _ = objects.userns_offset(docker_engine.call("info"))
    assert on_host.stat().st_uid == NOTEBOOK_UID + uid_off  # the notebook user's, never root's
    back = tmp_path / "back.bin"
    down = subprocess.run(
        ["scp", *common, f"{login}@127.0.0.1:/workspace/data.bin", str(back)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert down.returncode == 0 and back.read_bytes() == payload, down.stderr

    batch = tmp_path / "batch"
    got = tmp_path / "got.txt"
    (tmp_path / "note.txt").write_text("written over sftp\n")
    batch.write_text(f"put {tmp_path / 'note.txt'} note.txt\nls -l\nget note.txt {got}\n")
    sftp = subprocess.run(
        ["sftp", "-b", str(batch), *common, f"{login}@127.0.0.1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert sftp.returncode == 0, sftp.stderr
    assert "note.txt" in sftp.stdout and "data.bin" in sftp.stdout
    assert got.read_text() == "written over sftp\n"
    assert (hub.home / "projects" / OWNER / PROJECT / "note.txt").exists()


def wait_for_port(port: int, proc: subprocess.Popen, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode()
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError(f"ssh -L did not listen on {port}")


def test_forwards_to_the_projects_jupyter_server_and_a_unix_socket(started, clients, tmp_path):
    c = clients[OWNER]
    login = f"{OWNER}+{PROJECT}"
    port = free_port()
    forward = ("-N", "-o", "ExitOnForwardFailure=yes", "-L", f"{port}:localhost:8888")
    fwd = c.popen(login, None, *forward)
    try:
        wait_for_port(port, fwd)
        r = requests.get(f"http://127.0.0.1:{port}/user/{OWNER}/{PROJECT}/api", timeout=30)
        assert r.status_code == 200 and "version" in r.json(), r.text
        # several connections over the one SSH connection
        for _ in range(3):
            assert requests.get(r.url, timeout=30).ok
    finally:
        fwd.terminate()
        fwd.wait(10)

    # A Unix socket in the container (VS Code's remoteServerListenOnSocket): a tiny
    # server as the notebook user answers in upper case.
    server = (
        'python -c "import socket,os\n'
        "p='/tmp/gw-test.sock'\n"
        "os.path.exists(p) and os.unlink(p)\n"
        "s=socket.socket(socket.AF_UNIX); s.bind(p); s.listen(1); print('ready', flush=True)\n"
        'c,_=s.accept(); c.sendall(c.recv(100).upper()); c.close()"'
    )
    serving = c.popen(login, server)
    try:
        assert serving.stdout.readline().strip() == b"ready"
        local = tmp_path / "local.sock"
        fwd = c.popen(
            login, None, "-N", "-o", "ExitOnForwardFailure=yes", "-L", f"{local}:/tmp/gw-test.sock"
        )
        deadline = time.monotonic() + 20
        while not local.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(20)
            s.connect(str(local))
            s.sendall(b"ping")
            assert s.recv(100) == b"PING"
        fwd.terminate()
        fwd.wait(10)
    finally:
        serving.kill()
        serving.wait(10)

    # Only the container's own loopback: no other address, no remote (-R) forwards.
    far = c.ssh(login, None, "-W", "10.0.0.1:22", input="")
    assert far.returncode != 0 and "administratively prohibited" in far.stderr, far.stderr
    refused = c.ssh(login, None, "-W", "localhost:1", input="")
    assert refused.returncode != 0 and "nothing answers on port 1" in refused.stderr, refused.stderr
    remote = c.ssh(login, "true", "-o", "ExitOnForwardFailure=yes", "-R", "0:localhost:22")
    assert remote.returncode != 0, remote.stderr


# --- others, viewers, strangers, passwords, limits ------------------------------------------


def test_collaborator_gets_a_shell_viewer_and_others_are_refused(hub, started, people, clients):
    owner = people[OWNER]
    for name, role in ((COLLAB, "collaborator"), (VIEWER, "viewer")):
        r = page_post(owner, PROJECT, action="user", name=name, role=role)
        assert r.status_code == 200 and f"as {role}" in r.text, r.text
    collab = clients[COLLAB].ssh(f"{COLLAB}+{OWNER}~{PROJECT}", "id -un; pwd; ls")
    assert collab.returncode == 0, collab.stderr
    assert collab.stdout.split()[:2] == ["jovyan", "/workspace"] and "data.bin" in collab.stdout

    viewer = clients[VIEWER].ssh(f"{VIEWER}+{OWNER}~{PROJECT}", "id")
    assert viewer.returncode == 1 and viewer.stdout == ""
    assert "viewer" in viewer.stderr and "collaborator" in viewer.stderr, viewer.stderr
    no_forward = clients[VIEWER].ssh(
        f"{VIEWER}+{OWNER}~{PROJECT}", None, "-W", "localhost:8888", input=""
    )
    assert no_forward.returncode != 0 and "viewer" in no_forward.stderr, no_forward.stderr

    # Another user, with their own key: not shared; a project that does not exist reads
    # the same; and their key is no way into the owner's own login.
    other = clients[OTHER].ssh(f"{OTHER}+{OWNER}~{PROJECT}", "id")
    unknown = clients[OTHER].ssh(f"{OTHER}+{OWNER}~nosuch", "id")
    assert other.returncode == unknown.returncode == 1 and other.stdout == ""
    assert f"{OWNER} has no project {PROJECT} shared with you" in other.stderr, other.stderr
    assert other.stderr.replace(PROJECT, "X") == unknown.stderr.replace("nosuch", "X")
    stolen = clients[OTHER].ssh(f"{OWNER}+{PROJECT}", "id")
    assert stolen.returncode == 255 and "Permission denied" in stolen.stderr
    malformed = clients[OWNER].ssh(f"{OWNER}+", "id")
    assert malformed.returncode == 255 and "Permission denied" in malformed.stderr
    assert "<you>+<project>" in malformed.stderr  # the banner says how to log in


def test_a_login_without_a_project_is_told_what_to_type(hub, started, people, clients):
    """``ssh alice@host``, the natural first try: the account's own key is let in only
    to be told the login name to type and the account's own projects; anyone else's key
    gets the refusal of a wrong key, the login forms, and no project name."""
    port = hub.env["GPULAB_SSH_PORT"]
    for options, command in (((), "id"), (("-tt",), None)):  # a command; a terminal
        told = clients[OWNER].ssh(OWNER, command, *options, input="")
        assert told.returncode == 1 and told.stdout == "", told
        assert "Permission denied" not in told.stderr
        assert (
            f"gpulab: name the project: ssh -p {port} {OWNER}+<project>@<host> "
            f"(your projects: {PROJECT})."
        ) in told.stderr, told.stderr
        assert f"{OWNER}+<owner>~<project>" in told.stderr
    # A forward from such a login says the same, and goes nowhere.
    forward = clients[OWNER].ssh(OWNER, None, "-W", "localhost:8888", input="")
    assert forward.returncode != 0 and f"{OWNER}+<project>" in forward.stderr, forward.stderr
    # The viewer's own projects: none (a project shared with them is not theirs to list).
    viewer = clients[VIEWER].ssh(VIEWER, "id")
    assert viewer.returncode == 1 and "(your projects: none yet" in viewer.stderr, viewer.stderr
    assert f"{OWNER}~" not in viewer.stderr
    # Another's key on the owner's bare name: refused as a wrong key, nothing listed.
    stolen = clients[OTHER].ssh(OWNER, "id")
    assert stolen.returncode == 255 and "Permission denied" in stolen.stderr
    assert "<you>+<project>" in stolen.stderr and "your projects" not in stolen.stderr


def secrets_page(user, **form):
    xsrf = user.http.cookies.get("_xsrf", path="/hub/") or ""
    r = user.http.post(f"{user.base}/hub/gpulab/secrets", data={"_xsrf": xsrf, **form}, timeout=30)
    assert r.status_code == 200, r.text
    return r


def test_sessions_get_the_secrets_the_owner_chose_collaborators_only_if_allowed(
    hub, started, people, clients, where
):
    owner = people[OWNER]
    value = "gw-" + os.urandom(12).hex()
    secrets_page(owner, action="add", name="GW_TOKEN", value=value)
    secrets_page(owner, action="choose", project=PROJECT, names="GW_TOKEN")
    show = "echo token=${GW_TOKEN:-none}"
    assert clients[OWNER].ssh(f"{OWNER}+{PROJECT}", show).stdout.strip() == f"token={value}"
    collab = clients[COLLAB].ssh(f"{COLLAB}+{OWNER}~{PROJECT}", show)
    assert collab.stdout.strip() == "token=none", collab.stderr
    secrets_page(owner, action="choose", project=PROJECT, names="GW_TOKEN", collaborators="1")
    collab = clients[COLLAB].ssh(f"{COLLAB}+{OWNER}~{PROJECT}", show)
    assert collab.stdout.strip() == f"token={value}", collab.stderr
    assert value not in where["log"].read_text() and value not in hub.log


def askpass(tmp_path: Path, secret: str) -> dict:
    script = tmp_path / f"askpass-{time.monotonic_ns()}"
    script.write_text(f"#!/bin/sh\necho '{secret}'\n")
    script.chmod(0o700)
    return {**os.environ, "SSH_ASKPASS": str(script), "SSH_ASKPASS_REQUIRE": "force"}


PASSWORD_ONLY = (
    "-o", "PreferredAuthentications=password", "-o", "PubkeyAuthentication=no",
    "-o", "NumberOfPasswordPrompts=1", "-o", "BatchMode=no",
)  # fmt: skip


def test_hub_token_as_password(hub, started, people, clients, known_hosts, tmp_path):
    owner = people[OWNER]
    c = Client(hub, known_hosts, None)
    login = f"{OWNER}+{PROJECT}"
    right = c.ssh(login, "id -un", *PASSWORD_ONLY, env=askpass(tmp_path, owner.token))
    assert right.returncode == 0 and right.stdout.strip() == "jovyan", right.stderr
    wrong = c.ssh(login, "id -un", *PASSWORD_ONLY, env=askpass(tmp_path, "0" * 32))
    assert wrong.returncode == 255 and "Permission denied" in wrong.stderr
    # The project server's own token is the owner's, and everyone who runs code in the
    # container can read it: it is no password.
    server_token = clients[OWNER].ssh(login, "echo $JUPYTERHUB_API_TOKEN").stdout.strip()
    assert server_token
    server = c.ssh(login, "id -un", *PASSWORD_ONLY, env=askpass(tmp_path, server_token))
    assert server.returncode == 255 and "Permission denied" in server.stderr
    # Another user's token does not open the owner's login.
    others = c.ssh(login, "id -un", *PASSWORD_ONLY, env=askpass(tmp_path, people[OTHER].token))
    assert others.returncode == 255


def test_wrong_tokens_lock_the_account_others_unaffected(
    hub, started, people, clients, known_hosts, tmp_path
):
    locked = people[LOCKED]
    c = Client(hub, known_hosts, None)
    login = f"{LOCKED}+{PROJECT}"
    for n in range(5):  # the hub's GPULAB_LOGIN_ATTEMPTS (5)
        bad = c.ssh(login, "true", *PASSWORD_ONLY, env=askpass(tmp_path, f"{n}" * 32))
        assert bad.returncode == 255, bad.stderr
    right = c.ssh(login, "true", *PASSWORD_ONLY, env=askpass(tmp_path, locked.token))
    assert right.returncode == 255
    assert "Too many failed logins" in right.stderr and "Try again in 5 minutes" in right.stderr
    # The owner, from the same address, by token and by key: unaffected.
    owner_token = askpass(tmp_path, people[OWNER].token)
    owner = c.ssh(f"{OWNER}+{PROJECT}", "id -un", *PASSWORD_ONLY, env=owner_token)
    assert owner.returncode == 0 and owner.stdout.strip() == "jovyan", owner.stderr
    assert clients[OWNER].ssh(f"{OWNER}+{PROJECT}", "true").returncode == 0


# --- revocation, and the session log ----------------------------------------------------------


def test_revoked_collaborator_is_closed_and_refused(hub, started, people, clients):
    owner = people[OWNER]
    login = f"{COLLAB}+{OWNER}~{PROJECT}"
    open_session = clients[COLLAB].popen(login, "echo open; sleep 600")
    assert open_session.stdout.readline().strip() == b"open"
    r = page_post(owner, PROJECT, action="revoke-user", name=COLLAB)
    assert r.status_code == 200, r.text
    t0 = time.monotonic()
    try:
        open_session.wait(REVOKE_WITHIN_S + 15)
    except subprocess.TimeoutExpired:
        open_session.kill()
        raise AssertionError(
            f"the revoked collaborator's session is open {REVOKE_WITHIN_S + 15} s later"
        ) from None
    took = time.monotonic() - t0
    err = open_session.stderr.read().decode()
    print(f"\nrevoked collaborator's session closed after {took:.1f} s: {err.strip()!r}")
    assert took <= REVOKE_WITHIN_S + 5
    assert open_session.returncode != 0
    # said in the session itself, and as the reason of the disconnection
    said = [line for line in err.splitlines() if line.startswith(f"{OWNER} has no project")]
    assert said and said[0].endswith("This connection is closed."), err
    again = clients[COLLAB].ssh(login, "id")
    assert again.returncode == 1
    assert f"{OWNER} has no project {PROJECT} shared with you" in again.stderr


def test_session_log_has_one_line_per_session_and_no_secret(hub, started, people, where):
    records = session_log(where)
    ends = [r for r in records if r["event"] == "session-end"]
    kinds = {(r["user"], r["owner"], r["project"], r["kind"]) for r in ends}
    for kind in ("exec", "shell", "sftp", "forward"):
        assert (OWNER, OWNER, PROJECT, kind) in kinds, kinds
    assert (COLLAB, OWNER, PROJECT, "exec") in kinds
    # one end line per session, and every session that started has ended
    ids = [r["session"] for r in ends]
    assert len(ids) == len(set(ids)), ids
    started_ids = {r["session"] for r in records if r["event"] == "session-start"}
    assert started_ids and started_ids <= set(ids)
    exit7 = [r for r in ends if r.get("exit_status") == 7]
    assert exit7 and all(isinstance(r["duration_s"], float) for r in ends)
    assert any(r["event"] == "revoked" and r["user"] == COLLAB for r in records)
    ok = [r for r in records if r["event"] == "auth" and r["ok"]]
    assert {r["method"] for r in ok} == {"publickey", "password"}
    assert all(r["fingerprint"].startswith("SHA256:") for r in ok if r["method"] == "publickey")
    text = where["log"].read_text()
    for person in people.values():
        assert person.token not in text and person.token not in hub.log
    assert "sys.prefix" not in text and "from-the-script" not in text  # no command text
    assert (where["log"].stat().st_mode & 0o777) == 0o600
