"""A damaged or missing link-access record fails closed (issue 35, item 6), on the hub
in-process (pagehub.py): bob accepts alice's collaborator link on JupyterHub's accept
page, which gives him access until the link expires (in an hour). The record of when
that access ends is then damaged as a crash, a full disk or an editor would leave it
(truncated JSON, the right JSON with the wrong types, the file gone). The hub cannot
tell any more which access ends with a link: bob's access ends within the hub's revoke
bound (he reads "No project ... is shared with you."), never lasts until someone
revokes it, and the hub's log says so in words."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time

import pytest
from jupyterhub import orm
from pagehub import page_hub

from gpulab_hub.sharing import linkaccess, roles

OWNER, PROJECT, GUEST = "alice", "vision", "bob"
RUNTIME = f"/hub/gpulab/runtime/{OWNER}/{PROJECT}"  # a collaborator's page
REFUSED = f"No project {OWNER}/{PROJECT} is shared with you."
REVOKE_WITHIN_S = 2  # the hub sweeps every second


def truncated(path):
    text = path.read_text()
    path.write_text(text[: len(text) // 2])


def wrong_types(path):
    data = json.loads(path.read_text())
    for rec in data["links"].values():
        if "scopes" in rec:
            rec["scopes"] = sorted(rec["scopes"])  # a list where a mapping belongs
    path.write_text(json.dumps(data))


def gone(path):
    path.unlink()


@pytest.fixture
async def inproc(tmp_path):
    """The in-process hub (named so: `hub` is the suite's hub started by `gpulab up`)."""
    hub = await page_hub(tmp_path / "gpulab", GPULAB_REVOKE_WITHIN_S=str(REVOKE_WITHIN_S))
    yield hub
    await hub.stop()


def make_link(hub) -> str:
    spawner = hub._project(OWNER, PROJECT, "").orm_spawner
    hub.user(GUEST)
    code, secret = orm.ShareCode.new(
        hub.db,
        spawner,
        scopes=roles.share_scopes("collaborator", OWNER, PROJECT),
        expires_in=3600,
    )
    linkaccess.hub_store().mark(code, linkaccess.LINK)
    return secret


async def wait_for(hub, code: int, within: float):
    deadline = time.monotonic() + within
    while True:
        page = await hub.get(RUNTIME, GUEST)
        if page.code == code or time.monotonic() > deadline:
            return page
        await asyncio.sleep(0.2)


@pytest.mark.parametrize("damage", [truncated, wrong_types, gone])
async def test_damaged_link_access_record_ends_the_access_it_bounded(inproc, damage, caplog):
    hub = inproc
    caplog.set_level(logging.INFO)
    secret = await asyncio.to_thread(make_link, hub)
    accepted = await hub.post_form(f"/hub/accept-share?code={secret}", GUEST, {"code": secret})
    assert accepted.code in (200, 302), accepted.text[:300]
    assert (await hub.get(RUNTIME, GUEST)).code == 200
    store = linkaccess.hub_store()
    record = json.loads(store.path.read_text())
    assert any(k.startswith("grant:") for k in record["links"]), record

    damage(store.path)
    page = await wait_for(hub, 404, within=REVOKE_WITHIN_S + 15)
    assert page.code == 404 and REFUSED in page.text, (page.code, page.text[:300])
    shares = await asyncio.to_thread(lambda: hub.db.query(orm.Share).count())
    assert shares == 0
    # It stays ended: the hub's next sweeps give nothing back.
    await asyncio.sleep(REVOKE_WITHIN_S)
    assert (await hub.get(RUNTIME, GUEST)).code == 404

    words = "\n".join(r.getMessage() for r in caplog.records)
    assert re.search(r"The link access record \S+link-access\.json is (damaged|missing)", words)
    assert "cannot tell which access ends with a link" in words
    assert f"user {GUEST} on {OWNER}/{PROJECT}" in words, words[-2000:]
