"""The GPU queue as a person meets it, in Chromium, on a hub of its own.

The hub believes it has two GPUs: a site configuration file in
``$GPULAB_HOME/jupyterhub_config.d/`` (hubfiles.config_d_files) gives its spawner
an inventory of plain data (faults_kit.inventory, never a fake NVML). alice/train
and bob/sweep hold the two (their holdings in the hub's allocation record, their
project containers alive). carol starts "fit", which asks for one GPU:

1. her spawn page says she waits for a GPU, that she is next in line, and that the
   GPUs are in use by other projects (she is no admin: not whose); her home page row
   says "waiting for a GPU", where she stands and the same, and offers Cancel;
2. one click on the spawn page's "Stop starting" takes her out of the queue and ends
   the start: the page says "Project fit is not running" and offers Start; the queue
   record is empty after.

Whether a release starts her by itself, within 2 s, is tested through the spawner's
own path in test_gpu_queue_spawn.py and on the GPU machine (test_gpu_queue_gpu.py):
here the GPUs are data, and no container could be given them.

Screenshots: test-output/gpu-queue-spawn.png, gpu-queue-home.png, gpu-queue-cancelled.png.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from browser_kit import SHOTS
from conftest import PREFIX, hub_env, start_hub
from faults_kit import inventory
from playwright.sync_api import expect
from security.people import log_in_admin, make_user, password

from gpulab_hub import host
from gpulab_hub.gpus import allocator
from gpulab_hub.gpus import spawner as gpu_spawner
from gpulab_hub.gpus.queue import QueueStore

pytestmark = [pytest.mark.browser, pytest.mark.docker]

QPREFIX = PREFIX + "q"  # this hub's containers
TESTS = Path(__file__).resolve().parent
TWO_GPUS = f"""
# A test hub of two GPUs made of plain data (tests/faults_kit.py).
import sys
sys.path.insert(0, {str(TESTS)!r})
from faults_kit import inventory
from gpulab_hub.gpus import spawner as gpu_spawner
gpu_spawner.cached_inventory = lambda: inventory(2)
"""
CAROL, PROJECT = "qcarol", "fit"


@pytest.fixture(scope="module")
def queue_hub(docker_engine, local_debian, tmp_path_factory):
    home = tmp_path_factory.mktemp("gpulab-queue-home")
    site = home / "jupyterhub_config.d"
    site.mkdir(mode=0o755)
    (site / "50-two-gpus.py").write_text(TWO_GPUS)
    (site / "50-two-gpus.py").chmod(0o644)
    h = start_hub(home, hub_env(home, GPULAB_CONTAINER_PREFIX=QPREFIX))
    dk = host.Docker()
    holders = []
    try:
        s = gpu_spawner.GpuTraits(allocations_file=str(home / "hub" / "gpu-allocations.json"))
        for owner, project in (("alice", "train"), ("bob", "sweep")):
            c = dk.call(
                "create_container",
                image=local_debian,
                command=["sleep", "900"],
                name=f"{QPREFIX}-{owner}--{project}",
                labels={
                    "gpulab.instance": QPREFIX,
                    "gpulab.owner": owner,
                    "gpulab.project": project,
                },
            )
            dk.call("start", c["Id"])
            holders.append(c["Id"])
            store = gpu_spawner.store_of(s)
            store.allocate(
                inventory(2).devices,
                allocator.Request(owner, project, 1),
                gpu_spawner.policy_of(s),
            )
        yield h
    finally:
        for cid in holders:
            dk.call("remove_container", cid, force=True)
        down = h.gpulab("down")
        assert down.returncode == 0, down.stderr


def log_in(page, base: str, name: str) -> None:
    page.goto(f"{base}/hub/login")
    page.get_by_label("Username").fill(name)
    page.get_by_label("Password").fill(password(name))
    page.get_by_role("button", name="Sign In").click()
    expect(page).to_have_url(re.compile(r".*/hub/home.*"))


def test_a_start_waits_for_a_gpu_says_who_holds_them_and_one_click_cancels(queue_hub, browser):
    hub = queue_hub
    admin = log_in_admin(hub)
    carol = make_user(hub, admin, CAROL)
    held = json.loads((hub.home / "hub" / "gpu-allocations.json").read_text())["holdings"]
    assert sorted(h["owner"] for hs in held.values() for h in hs) == ["alice", "bob"]

    r = carol.api("POST", f"/hub/api/users/{CAROL}/servers/{PROJECT}", json={"gpus": 1})
    assert r.status_code in (201, 202), r.text
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(20_000)
    page = context.new_page()
    try:
        log_in(page, hub.url, CAROL)
        page.goto(f"{hub.url}/hub/spawn-pending/{CAROL}/{PROJECT}")
        words = page.locator("#progress-message")
        # the first build of "fit" comes first
        expect(words).to_contain_text("waiting for a GPU: next in line", timeout=240_000)
        text = words.inner_text()
        # carol is no admin: who holds the GPUs is not hers to know (docs/security.md)
        assert text.count("is in use by another project") == 2, text
        assert not any(n in text for n in ("alice", "train", "bob", "sweep")), text
        page.screenshot(path=SHOTS / "gpu-queue-spawn.png", full_page=True)
        entries = QueueStore(hub.home / "hub" / "gpu-queue.json").entries()
        assert [(e.owner, e.project) for e in entries] == [(CAROL, PROJECT)]

        home = context.new_page()
        home.goto(f"{hub.url}/hub/home")
        row = home.locator(f'[data-project="{PROJECT}"]').first
        expect(row.locator(".gpu-waiting")).to_have_text("waiting for a GPU")
        where = row.locator(".gpu-waiting-where")
        expect(where).to_contain_text("next in line; GPU 0 is in use by another project")
        assert "alice" not in where.inner_text() and "bob" not in where.inner_text()
        expect(row.get_by_role("button", name="Cancel")).to_be_visible()
        home.screenshot(path=SHOTS / "gpu-queue-home.png", full_page=True)
        home.close()

        page.get_by_role("button", name=re.compile("Stop starting")).click()
        # the start ends: the page says the project is not running and offers Start
        heading = page.get_by_role("heading", name=f"Project {PROJECT} is not running")
        expect(heading).to_be_visible(timeout=30_000)
        expect(page.get_by_role("button", name=f"Start {PROJECT}")).to_be_visible()
        page.screenshot(path=SHOTS / "gpu-queue-cancelled.png", full_page=True)
    finally:
        context.close()
    end = time.monotonic() + 30
    while QueueStore(hub.home / "hub" / "gpu-queue.json").entries():
        assert time.monotonic() < end, "the cancelled start is still in the queue"
        time.sleep(0.5)
    model = carol.api("GET", f"/hub/api/users/{CAROL}").json()
    assert PROJECT not in model["servers"] or not model["servers"][PROJECT]["pending"]
