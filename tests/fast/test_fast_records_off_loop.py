"""No file lock on the hub's event loop when shares change (issue 35, item 5), on the
hub in-process (pagehub.py). Another process holds the lock of the record the change
needs; meanwhile the hub answers everyone else at once (/hub/health within 1 s), the
change takes effect for JupyterHub when its answer comes back, and the record follows
once the lock is free (or the hub says in words why it did not)."""

from __future__ import annotations

import asyncio
import html
import json
import re
import subprocess
import sys
import time
from urllib.parse import urlencode

import pytest
from jupyterhub import orm
from pagehub import page_hub

from gpulab_hub.sharing import groupshares, linkaccess, roles

OWNER, PROJECT, GROUP, MEMBER = "alice", "vision", "lab", "carol"
SHARES = f"/hub/api/shares/{OWNER}/{PROJECT}"

# Holds a record's lock (filelock, as another hub process would) until stdin closes.
HOLD = (
    "import sys\n"
    "from filelock import FileLock\n"
    "lock = FileLock(sys.argv[1])\n"
    "lock.acquire()\n"
    "print('held', flush=True)\n"
    "sys.stdin.read()\n"
)


class Held:
    def __init__(self, lock_path):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(lock_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout.readline().strip() == "held"

    def release(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            assert self.proc.wait(timeout=60) == 0


@pytest.fixture
async def inproc(tmp_path):
    """The in-process hub (named so: `hub` is the suite's hub started by `gpulab up`)."""
    hub = await page_hub(tmp_path / "gpulab")
    yield hub
    await hub.stop()


def setup_group(hub) -> str:
    hub._project(OWNER, PROJECT, "")
    member = hub.user(MEMBER).orm_user
    group = orm.Group(name=GROUP)
    group.users.append(member)
    hub.db.add(group)
    hub.db.commit()
    return hub.user(OWNER).orm_user.new_api_token(note="the owner's laptop")


async def timed(coro) -> tuple[float, object]:
    started = time.monotonic()
    result = await coro
    return time.monotonic() - started, result


async def while_held(hub, change):
    """``change`` (an API call) and, right behind it, /hub/health: how long health took,
    and the change's answer."""
    answer = asyncio.ensure_future(change)
    await asyncio.sleep(0)  # the change's request goes out first
    took, health = await timed(hub.get("/hub/health", None))
    assert health.code == 200
    return took, await answer


async def share_with_group(hub) -> None:
    """The owner shares the project with the group, as the Share page does: JupyterHub's
    own share, committed on the hub's event loop."""
    spawner = hub.user(OWNER).orm_user.orm_spawners[PROJECT]
    group = orm.Group.find(hub.db, GROUP)
    orm.Share.grant(hub.db, spawner, group, roles.share_scopes("viewer", OWNER, PROJECT))


def role_of_share(hub):
    name = groupshares.role_name(OWNER, PROJECT, GROUP)
    hub.db.expire_all()
    role = orm.Role.find(hub.db, name)
    return name, role


async def wait_recorded(path, name: str, present: bool, within: float = 20) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else "{}"
        if (name in json.loads(text).get("roles", {})) == present:
            return True
        await asyncio.sleep(0.2)
    return False


async def test_a_group_share_made_and_revoked_while_its_record_is_locked(inproc):
    hub = inproc
    token = await asyncio.to_thread(setup_group, hub)
    auth = {"headers": {"Authorization": f"token {token}"}}
    record = groupshares._Watch.roles.path
    held = Held(record.with_name(record.name + ".lock"))
    try:
        took, _ = await while_held(hub, share_with_group(hub))
        assert took < 1.0, f"/hub/health waited {took:.1f} s behind the share's record"
        name, role = role_of_share(hub)
        assert role is not None and GROUP in [g.name for g in role.groups]  # members get in
        assert not await wait_recorded(record, name, True, within=1)  # the lock is held
    finally:
        held.release()
    assert await wait_recorded(record, name, True)  # written once the lock is free

    held = Held(record.with_name(record.name + ".lock"))
    try:
        took, revoked = await while_held(hub, hub.fetch(SHARES, None, method="DELETE", **auth))
        assert revoked.code in (200, 204), revoked.body
        assert took < 1.0, f"/hub/health waited {took:.1f} s behind the revoke's record"
        assert role_of_share(hub)[1] is None  # the members' access ends with the answer
    finally:
        held.release()
    assert await wait_recorded(record, name, False)  # and the next start makes no role


GUEST = "bob"
RUNTIME = f"/hub/gpulab/runtime/{OWNER}/{PROJECT}"  # a collaborator's page


def make_link(hub) -> str:
    spawner = hub._project(OWNER, PROJECT, "").orm_spawner
    hub.user(GUEST)
    _, secret = orm.ShareCode.new(
        hub.db,
        spawner,
        scopes=roles.share_scopes("collaborator", OWNER, PROJECT),
        expires_in=3600,
    )
    return secret


async def offer(hub, secret: str):
    """Bob opens the link's page (its offer, read before the record is held); what
    pressing its Accept button then sends."""
    page = await hub.get(f"/hub/accept-share?code={secret}", GUEST)
    assert page.code == 200, page.text[:300]
    xsrf = html.unescape(re.search(r'name="_xsrf" value="([^"]+)"', page.body)[1])
    cookie = re.search(r"_xsrf=([^;]+)", page.headers.get("Set-Cookie", ""))
    jar = hub.cookies(GUEST) + (f"; _xsrf={cookie[1]}" if cookie else "")
    body = urlencode({"code": secret, "_xsrf": xsrf})
    return lambda: hub.fetch(
        "/hub/accept-share", None, method="POST", headers={"Cookie": jar}, body=body
    )


async def health_behind(hub, pending) -> float:
    """Seconds from a moment after ``pending`` went out until /hub/health answered."""
    started = time.monotonic()
    await asyncio.sleep(1)  # the acceptance is waiting for the record by now
    assert not pending.done()
    health = await hub.get("/hub/health", None)
    assert health.code == 200
    return time.monotonic() - started - 1


async def test_a_link_accepted_while_its_record_is_locked(inproc):
    """Bob presses Accept on alice's link while another process holds the link-access
    record: the hub answers others at once; bob's acceptance completes once the lock is
    free, with the record of when his access ends."""
    hub = inproc
    secret = await asyncio.to_thread(make_link, hub)
    press = await offer(hub, secret)
    record = linkaccess.hub_store().path
    held = Held(record.with_name(record.name + ".lock"))
    try:
        accept = asyncio.ensure_future(press())
        took = await health_behind(hub, accept)
        assert took < 1.0, f"/hub/health waited {took:.1f} s behind an acceptance's record"
    finally:
        held.release()
    accepted = await accept
    assert accepted.code == 302, accepted.text[:300]
    assert (await hub.get(RUNTIME, GUEST)).code == 200
    grants = json.loads(record.read_text())["links"]
    assert any(k.startswith(f"grant:{OWNER}/{PROJECT}:user:{GUEST}") for k in grants), grants


async def test_a_link_accepted_while_its_record_stays_locked_gives_nothing(inproc):
    """The record stays held past the hub's bound (10 s): bob is told so in words and
    has no access (none that would outlast the link)."""
    hub = inproc
    secret = await asyncio.to_thread(make_link, hub)
    press = await offer(hub, secret)
    record = linkaccess.hub_store().path
    held = Held(record.with_name(record.name + ".lock"))
    try:
        accept = asyncio.ensure_future(press())
        took = await health_behind(hub, accept)
        assert took < 1.0, f"/hub/health waited {took:.1f} s behind an acceptance's record"
        refused = await accept
    finally:
        held.release()
    assert refused.code == 503, refused.text[:300]
    assert "The link access record is busy" in refused.text, refused.text[:600]
    assert (await hub.get(RUNTIME, GUEST)).code == 404
