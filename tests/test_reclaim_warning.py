"""A warned project's JupyterLab learns of the warning: the hub's answer
(gpus/reclaimapi.py), the project server's GPU status that carries it (asked of the hub
with the server's own token, at most every 30 s), and the lab's notification, in a real
JupyterLab through Chromium, shown once per warning and withdrawn when the hub says so.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from gpulab_hub.gpus import reclaimapi
from gpulab_hub.gpus.reclaimrecord import Warning
from gpulab_jupyter import handlers

NOW = 1_750_000_000.0
WAITING = {
    "warned": True,
    "reason": "waiting",
    "stops_at": NOW + 600,
    "words": "someone is waiting for this GPU: this project stops in 10 min unless you use "
    "it (its files are kept)",
}


def test_the_hubs_answer_says_when_and_why():
    assert reclaimapi.answer(None, NOW) == {
        "warned": False, "reason": "", "stops_at": None, "words": "",
    }  # fmt: skip
    w = Warning("ann", "p", NOW - 120, NOW + 480, "idle", NOW - 47 * 60)
    assert reclaimapi.answer(w, NOW) == {
        "warned": True,
        "reason": "idle",
        "stops_at": NOW + 480,
        "words": "this project has been idle for 47 min: this project stops in 8 min unless "
        "you use it (its files are kept)",
    }


def test_the_status_takes_only_a_well_formed_warning():
    assert handlers.reclaim_of(WAITING) == {
        "reason": "waiting", "stops_at": NOW + 600, "words": WAITING["words"],
    }  # fmt: skip
    for bad in (
        None, [], {"warned": False}, {**WAITING, "warned": "yes"}, {**WAITING, "stops_at": "x"},
        {**WAITING, "stops_at": True}, {**WAITING, "words": ""}, {**WAITING, "reason": "evil"},
    ):  # fmt: skip
        assert handlers.reclaim_of(bad) is None, bad
    long = handlers.reclaim_of({**WAITING, "words": "a\nb " + "x" * 1000})
    assert long["words"].startswith("a b x") and len(long["words"]) == handlers.RECLAIM_WORDS_MAX


class FakeHub:
    """The hub's reclaim API for one project: what it answers, and who asked."""

    def __init__(self):
        self.answer: dict | None = WAITING
        self.status = 200
        self.asked: list[tuple[str, str]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                hub.asked.append((self.path, self.headers.get("Authorization", "")))
                body = json.dumps(hub.answer).encode()
                self.send_response(hub.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hub/api"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def env(self) -> dict[str, str]:
        return {
            "JUPYTERHUB_API_URL": self.url,
            "JUPYTERHUB_API_TOKEN": "servertoken0123456789",
            "JUPYTERHUB_USER": "ann",
            "JUPYTERHUB_SERVER_NAME": "my proj",
        }


@pytest.fixture
def fake_hub():
    hub = FakeHub()
    yield hub
    hub.server.shutdown()


async def test_the_server_asks_the_hub_for_its_own_project_at_most_every_30_s(
    fake_hub, monkeypatch
):
    clock = [1000.0]
    monkeypatch.setattr(handlers.time, "monotonic", lambda: clock[0])
    watch = handlers.ReclaimWatch(fake_hub.env())
    assert (await watch.get())["words"] == WAITING["words"]
    assert fake_hub.asked == [
        ("/hub/api/gpulab/reclaim/ann/my%20proj", "token servertoken0123456789")
    ]
    fake_hub.answer = {"warned": False, "reason": "", "stops_at": None, "words": ""}
    clock[0] += 29
    assert (await watch.get())["words"] == WAITING["words"]  # not asked again yet
    assert len(fake_hub.asked) == 1
    clock[0] += 1
    assert await watch.get() is None  # withdrawn
    fake_hub.status, fake_hub.answer = 500, WAITING
    clock[0] += 30
    assert await watch.get() is None  # a failing hub: what it said last stands
    assert handlers.ReclaimWatch({}).url == ""  # outside a hub: never asked


# --- in a real JupyterLab, through Chromium ------------------------------------------------


@pytest.mark.browser
def test_the_lab_shows_the_warning_once_and_says_when_it_is_withdrawn(fake_hub, tmp_path):
    from playwright.sync_api import sync_playwright
    from test_lab_extension_browser import ARGS, CHROMIUM, OUT, running_lab

    # The lab extension as this tree builds it (``jlpm build`` in extensions/, which
    # scripts/setup.sh's install runs), ahead of the copy the install left in .venv.
    built = Path(handlers.__file__).with_name("labextension")
    assert (built / "package.json").exists(), "build the lab extension: cd extensions && jlpm build"
    data = tmp_path / "jupyter-data"
    (data / "labextensions").mkdir(parents=True)
    (data / "labextensions" / "gpulab-jupyter").symlink_to(built)
    env = {**fake_hub.env(), "JUPYTER_PATH": str(data)}
    with running_lab(tmp_path, extra_env=env) as (url, token, _log):
        r = requests.get(f"{url}/api/gpulab/v1/gpu", params={"token": token}, timeout=10)
        assert r.json()["reclaim"]["words"] == WAITING["words"]
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = b.new_page(viewport={"width": 1400, "height": 860})
            page.goto(f"{url}/lab?token={token}", wait_until="domcontentloaded")
            toast = page.locator(".Toastify__toast", has_text="Someone is waiting for this GPU")
            toast.wait_for(state="visible", timeout=90_000)
            assert "this project stops in 10 min unless you use it" in toast.inner_text()
            assert page.get_by_role("button", name="Keep it running").is_visible()
            OUT.mkdir(exist_ok=True)
            page.wait_for_timeout(1000)  # the notification has slid in
            page.screenshot(path=str(OUT / "lab-reclaim-warning.png"))
            time.sleep(5)  # status polls go on: still one notification
            assert toast.count() == 1
            fake_hub.answer = {"warned": False, "reason": "", "stops_at": None, "words": ""}
            page.locator(".Toastify__toast", has_text="The GPU warning was withdrawn").wait_for(
                state="visible", timeout=60_000
            )
            toast.wait_for(state="detached", timeout=10_000)  # the warning went with it
            b.close()
