"""An open SSH session counts as use: while a session or forward is open in a project,
the gateway marks the project's server active in the hub (its last_activity, what the
idle culler and the GPU keeper read), at most every ACTIVITY_EVERY_S.

Unit: the throttle and "only while a session is open". On the session hub: a real
``ssh`` session (Debian's OpenSSH client, a key added on the SSH page) moves the
project's last_activity while it is open, with no browser anywhere."""

from __future__ import annotations

import subprocess
import time
from datetime import datetime

import pytest
from security.people import log_in_admin, make_user
from test_ssh_gateway import Client

from gpulab_hub import ssh
from gpulab_hub.ssh import audit, gateway
from gpulab_hub.ssh.hubclient import HubError
from gpulab_hub.ssh.names import Login
from gpulab_hub.ssh.settings import Settings


class _Quiet:
    def write(self, s):
        pass

    def flush(self):
        pass


class FakeHub:
    def __init__(self, fail: bool = False):
        self.calls: list[tuple] = []
        self.fail = fail

    async def activity(self, owner, project, when):
        self.calls.append((owner, project, when))
        if self.fail:
            raise HubError("down")


def connection(tmp_path, hub) -> gateway.Connection:
    from gpulab_hub.ssh import limits

    settings = Settings(
        bind="127.0.0.1", port=1, host_key=tmp_path / "key", keys_dir=tmp_path / "keys",
        log="", prefix="gpulab", api_url="http://127.0.0.1:9/hub/api", api_token="t" * 32,
        limits=limits.Limits(),
    )  # fmt: skip
    gw = gateway.Gateway(settings, docker=None, hub=hub, audit=audit.Audit(None, _Quiet()))
    conn = gateway.Connection(gw)
    conn.login = Login("ann", "bob", "train")
    return conn


async def test_only_an_open_session_marks_the_project_active_at_most_every_30_s(
    tmp_path, monkeypatch
):
    clock = [1_750_000_000.0]
    monkeypatch.setattr(gateway.time, "time", lambda: clock[0])
    hub = FakeHub()
    conn = connection(tmp_path, hub)
    await conn.mark_active()
    assert hub.calls == []  # logged in, no session: not use
    conn.sessions.add(object())
    await conn.mark_active()
    assert hub.calls == [("bob", "train", clock[0])]  # the owner's project, now
    clock[0] += ssh.ACTIVITY_EVERY_S - 1
    await conn.mark_active()
    assert len(hub.calls) == 1
    clock[0] += 1
    await conn.mark_active()
    assert hub.calls[-1] == ("bob", "train", clock[0]) and len(hub.calls) == 2
    conn.sessions.clear()
    clock[0] += 3600
    await conn.mark_active()
    assert len(hub.calls) == 2


async def test_a_hub_that_does_not_answer_is_asked_again_next_time(tmp_path, monkeypatch):
    monkeypatch.setattr(gateway.time, "time", lambda: 1_750_000_000.0)
    hub = FakeHub(fail=True)
    conn = connection(tmp_path, hub)
    conn.sessions.add(object())
    await conn.mark_active()
    await conn.mark_active()
    assert len(hub.calls) == 2  # not throttled after a failure


def test_the_gateways_role_may_mark_activity():
    assert "users:activity" in ssh.SCOPES


# --- a real session on the session hub --------------------------------------------------------

OWNER, PROJECT = "sshbusy", "work"


def last_activity(user) -> float:
    model = user.api("GET", f"/hub/api/users/{OWNER}").json()["servers"][PROJECT]
    return datetime.fromisoformat(model["last_activity"]).timestamp()


@pytest.mark.docker
@pytest.mark.usefixtures("show_logs_on_failure")
def test_an_open_ssh_session_keeps_the_projects_last_activity_fresh(hub, tmp_path):
    owner = make_user(hub, log_in_admin(hub), OWNER)
    key = tmp_path / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], check=True)
    xsrf = owner.http.cookies.get("_xsrf", path="/hub/") or ""
    page = owner.http.post(
        f"{owner.base}/hub/gpulab/ssh",
        data={"_xsrf": xsrf, "action": "add", "key": key.with_suffix(".pub").read_text()},
        timeout=30,
    )
    assert "Added your ssh-ed25519 key" in page.text
    pub = ssh.paths(hub.home / "hub")["host_key"].with_suffix(".pub")
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{hub.env['GPULAB_SSH_PORT']} {pub.read_text().strip()}\n")
    owner.start_project(PROJECT)
    try:
        time.sleep(2)  # whatever the start itself reported lies behind us
        before = last_activity(owner)
        opened = time.time()
        session = Client(hub, known, key).popen(f"{OWNER}+{PROJECT}", "sleep 20")
        try:
            deadline = time.monotonic() + 15  # the gateway rechecks every 4 s here
            while last_activity(owner) <= max(before, opened - 1):
                assert session.poll() is None, session.stderr.read()
                assert time.monotonic() < deadline, "the open session did not mark it active"
                time.sleep(0.5)
        finally:
            session.kill()
            session.wait()
    finally:
        owner.stop_project(PROJECT)
