"""The JupyterLab extension in a real JupyterLab, through Debian's Chromium.

A plain `jupyter lab` from .venv (no hub) on a free 127.0.0.1 port with a
token; the gpulab-jupyter package is installed there as the README's set-up
leaves it. Screenshots go to test-output/. On a machine without a GPU the item
says "No GPU" and the panel explains why; on a GPU host the item shows numbers.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from browser_kit import CHROMIUM, CHROMIUM_ARGS, CHROMIUM_BINARY

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "test-output"
ARGS = CHROMIUM_ARGS
GPU_TEXT = re.compile(r"^(\d+ GPUs|GPU) (\d+%|n/a) · [\d.?]+/[\d.?]+ GiB$")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_lab(
    home: Path,
    extra_env: dict[str, str] | None = None,
    root: Path | None = None,
    args: tuple[str, ...] = (),
):
    """A real JupyterLab with the extension in ``home`` (serving ``root``, by default
    ``home``, with more command line ``args``); yields (url, token, log path)."""
    if not os.path.exists(CHROMIUM_BINARY):
        pytest.skip("Debian's chromium is not installed (scripts/setup.sh test installs it)")
    port, token = free_port(), secrets.token_hex(16)
    log = home / "lab.log"
    # No "Jupyter news?" prompt (and no news fetch) over the page.
    notif = home / "settings" / "@jupyterlab" / "apputils-extension"
    notif.mkdir(parents=True)
    (notif / "notification.jupyterlab-settings").write_text(
        '{"fetchNews": "false", "checkForUpdates": false}'
    )
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(home / "runtime"), **(extra_env or {}))
    cmd = [
        str(Path(sys.executable).parent / "jupyter"), "lab", "--no-browser",
        "--ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root or home}", f"--LabApp.workspaces_dir={home / 'ws'}",
        f"--LabApp.user_settings_dir={home / 'settings'}", "--allow-root", *args,
    ]  # fmt: skip
    with open(log, "wb") as out:
        # cwd: jupyter-collaboration keeps its store (.jupyter_ystore.db) in the current folder
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=home)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                r = requests.get(f"{url}/api/status", params={"token": token}, timeout=2)
                if r.ok:
                    break
            except requests.ConnectionError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("jupyter lab did not start:\n" + log.read_text()[-3000:])
            time.sleep(0.3)
        yield url, token, log
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A real JupyterLab with the extension; yields (url, token, log path)."""
    with running_lab(tmp_path_factory.mktemp("lab")) as running:
        yield running


@pytest.fixture(scope="module")
def browser(lab):
    from playwright.sync_api import sync_playwright

    OUT.mkdir(exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def page(lab, browser):
    url, token, _ = lab
    pg = browser.new_page(viewport={"width": 1400, "height": 860})
    pg.errors = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.goto(f"{url}/lab?token={token}", wait_until="domcontentloaded")
    pg.wait_for_selector("#jp-main-statusbar", timeout=90_000)
    yield pg
    pg.close()


def server_status(lab) -> dict:
    url, token, _ = lab
    r = requests.get(f"{url}/api/gpulab/v1/gpu", params={"token": token}, timeout=5)
    r.raise_for_status()
    return r.json()


def test_extension_is_installed_and_its_settings_load(lab):
    url, token, _ = lab
    r = requests.get(f"{url}/lab/api/settings/gpulab-jupyter:plugin", params={"token": token})
    assert r.status_code == 200, r.text
    props = r.json()["schema"]["properties"]
    assert {"refreshInterval", "memoryWarning", "temperatureWarning"} <= set(props)


def test_status_item_appears(lab, page):
    item = page.locator("#jp-main-statusbar [data-gpulab=status]")
    item.wait_for(state="visible", timeout=30_000)
    page.wait_for_function(
        "() => !document.querySelector('[data-gpulab=status]').textContent.includes('…')",
        timeout=30_000,
    )
    status = server_status(lab)
    text = item.inner_text().strip()
    page.screenshot(path=str(OUT / "lab-status-bar.png"))
    # The image is the Dockerfile's latest build: nothing says otherwise.
    assert page.locator("[data-gpulab=image-state]").count() == 0
    if status["available"]:
        assert GPU_TEXT.match(text), text
    else:
        assert text == "No GPU"
        assert item.get_attribute("title").startswith("No GPU: ")
        assert "jp-gpulab-level-none" in item.get_attribute("class")


def test_panel_opens_and_explains(lab, page):
    page.locator("[data-gpulab=status]").click()
    panel = page.locator("[data-gpulab=panel]")
    panel.wait_for(state="visible", timeout=30_000)
    status = server_status(lab)
    if status["available"]:
        page.locator("[data-gpulab=panel] .jp-gpulab-Card").first.wait_for(timeout=15_000)
        assert panel.locator(".jp-gpulab-Card").count() == len(status["gpus"])
    else:
        box = panel.locator(".jp-gpulab-NoGpu")
        box.wait_for(timeout=15_000)
        assert box.get_attribute("data-reason") == status["reason"]
        text = box.inner_text()
        assert "No GPU" in text
        assert status["message"] in text
        if status["reason"] == "no_driver":
            # This machine has no NVIDIA driver: the panel says that, and what to do,
            # never that a driver is here or that a GPU could be asked for.
            assert box.locator("h3").inner_text() == "No NVIDIA driver"
            assert status["message"].startswith("No NVIDIA driver here: ")
            hint = box.locator(".jp-gpulab-Hint").inner_text()
            assert hint == status["hint"]
            assert hint.startswith("Your code runs on the CPU. On your own machine, install")
            assert "driver is present" not in text and "ask for a GPU" not in text
    page.wait_for_timeout(500)
    page.screenshot(path=str(OUT / "lab-gpu-panel.png"))
    assert not [e for e in page.errors if "gpulab" in e.lower()], page.errors


def test_server_log_has_no_extension_errors(lab):
    _, _, log = lab
    text = log.read_text(errors="replace")
    assert "gpulab_jupyter | extension was successfully loaded" in text
    assert not re.search(r"Traceback.*gpulab", text, re.S), text[-3000:]


# -- The GPU layout, drawn from canned server answers --------------------------------------
# This machine has no GPU, so to look at the GPU panel the browser is answered with
# recorded-shape JSON (docs/gpu-status-api.md); the server path itself is covered for real
# by tests/test_lab_extension_gpu.py on a GPU host.
H100 = "GPU-5c3e9a04-8f2b-4c1d-9e6a-1b2c3d4e5f60"
MIG = "MIG-7d1a2b3c-4d5e-6f70-8192-a3b4c5d6e7f8"
GIB = 1 << 30


def canned(now: float) -> dict[str, dict]:
    import math

    common = {"available": True, "reason": None, "message": "", "interval": 1.0,
              "min_interval": 0.5, "process_interval": 5.0, "history_seconds": 600.0,
              "stale": False, "error": None, "error_since": None, "last_ok": now}  # fmt: skip
    gpus = [
        {"index": 0, "uuid": H100, "name": "NVIDIA H100 80GB HBM3", "nvml_index": "0",
         "mig": False, "parent_uuid": None, "utilization": 43, "memory_utilization": 20,
         "memory_used": int(12.1 * GIB), "memory_total": int(79.6 * GIB),
         "memory_free": int(67.5 * GIB), "temperature": 47, "power_draw": 312.4,
         "power_limit": 700.0},
        {"index": 1, "uuid": MIG, "name": "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
         "nvml_index": "1:0", "mig": True, "parent_uuid": "GPU-aaaa", "utilization": None,
         "memory_utilization": None, "memory_used": int(38 * GIB),
         "memory_total": int(39.5 * GIB), "memory_free": int(1.5 * GIB), "temperature": 38,
         "power_draw": 90.0, "power_limit": 400.0},
    ]  # fmt: skip
    n = 300
    ts = [now - (n - i) for i in range(n)]
    wave = [50 + 45 * math.sin(i / 15) for i in range(n)]
    history = {
        **common,
        "timestamps": ts,
        "gpus": {
            H100: {"utilization": [round(w) for w in wave],
                   "memory_used": [int((8 + 4 * i / n) * GIB) for i in range(n)],
                   "temperature": [40 + w / 10 for w in wave],
                   "power_draw": [100 + 4 * w for w in wave]},
            MIG: {"utilization": [None] * n,
                  "memory_used": [int(38 * GIB)] * n,
                  "temperature": [38] * n, "power_draw": [90] * n},
        },
    }  # fmt: skip
    kernel = {"id": "k1", "name": "python3", "path": "experiments/train.ipynb",
              "session": "train.ipynb", "type": "notebook"}  # fmt: skip
    processes = {
        "available": True,
        "stale": False,
        "error": None,
        "timestamp": now,
        "processes": [
            {"pid": 412, "name": "python", "kernel": kernel,
             "command": "python -m ipykernel_launcher -f /run/kernel-k1.json",
             "gpus": [{"uuid": H100, "index": 0, "memory_used": int(11.2 * GIB),
                       "match": "pid"}]},
            {"pid": 530, "name": "python", "kernel": None,
             "command": "python finetune.py --epochs 3",
             "gpus": [{"uuid": MIG, "index": 1, "memory_used": None, "match": None}]},
        ],
        "other": [{"uuid": MIG, "index": 1, "count": 2, "memory_used": int(30 * GIB)}],
    }  # fmt: skip
    status = {**common, "timestamp": now, "driver_version": "570.124.06", "gpus": gpus,
              "summary": {"count": 2, "utilization": 43.0,
                          "memory_used": int(50.1 * GIB), "memory_total": int(119.1 * GIB)},
              "sampler": {"ticks": 600, "tick_us_per_gpu": 40.0}}  # fmt: skip
    return {"gpu": status, "gpu/history": history, "gpu/processes": processes}


def test_gpu_panel_layout_with_canned_answers(lab, browser):
    url, token, _ = lab
    answers = canned(time.time())

    def answer(route):
        path = route.request.url.split("/api/gpulab/v1/", 1)[1].split("?", 1)[0]
        route.fulfill(status=200, content_type="application/json", body=json.dumps(answers[path]))

    pg = browser.new_page(viewport={"width": 1400, "height": 860})
    pg.route("**/api/gpulab/v1/gpu**", answer)
    pg.goto(f"{url}/lab?token={token}", wait_until="domcontentloaded")
    item = pg.locator("[data-gpulab=status]")
    item.wait_for(timeout=90_000)
    pg.wait_for_function(
        "() => document.querySelector('[data-gpulab=status]').textContent.includes('GiB')"
    )
    assert item.inner_text().strip() == "2 GPUs 43% · 50.1/119 GiB"
    assert "jp-gpulab-level-critical" in item.get_attribute("class")  # the MIG slice: 96% used
    title = item.get_attribute("title")
    assert "GPU 1: NVIDIA A100-SXM4-80GB MIG 3g.40gb (MIG slice) — n/a busy" in title
    item.click()
    panel = pg.locator("[data-gpulab=panel]")
    panel.locator(".jp-gpulab-ProcessTable").wait_for(timeout=30_000)
    assert panel.locator(".jp-gpulab-Card").count() == 2
    assert panel.locator(".jp-gpulab-Sparkline").count() >= 7
    table = panel.locator(".jp-gpulab-ProcessTable").inner_text()
    assert "experiments/train.ipynb (python3 kernel)" in table
    assert "2 other processes" in table and "unknown" in table
    pg.wait_for_timeout(300)
    pg.screenshot(path=str(OUT / "lab-gpu-panel-canned.png"))
    pg.close()


# -- Stale numbers, backoff, hidden tabs ---------------------------------------------------
API = "/api/gpulab/v1/"


def open_lab(browser, lab, handler=None):
    """A new page on the lab; ``handler`` (if given) answers every GPU route. The page's
    ``api_requests`` lists (monotonic time, path) of each request to the GPU routes."""
    url, token, _ = lab
    pg = browser.new_page(viewport={"width": 1400, "height": 860})
    pg.api_requests = []

    def seen(request):
        if API in request.url:
            path = request.url.split(API, 1)[1].split("?", 1)[0]
            pg.api_requests.append((time.monotonic(), path))

    pg.on("request", seen)
    if handler is not None:
        pg.route(f"**{API}gpu**", handler)
    pg.goto(f"{url}/lab?token={token}", wait_until="domcontentloaded")
    pg.locator("[data-gpulab=status]").wait_for(timeout=90_000)
    return pg


def set_visibility(pg, state: str) -> None:
    """What the browser says when the tab goes to the background (or comes back).

    Headless Chromium never hides a page by itself (a page opened in front of it
    stays "visible"), so the document's visibility is set the way a browser sets it,
    and its `visibilitychange` event fired, which is all a page can observe.
    """
    pg.evaluate(
        """state => {
            const define = (name, value) =>
                Object.defineProperty(document, name, {configurable: true, get: () => value});
            define('visibilityState', state);
            define('hidden', state === 'hidden');
            document.dispatchEvent(new Event('visibilitychange'));
        }""",
        state,
    )


def item_text(pg) -> str:
    return pg.locator("[data-gpulab=status]").inner_text().strip()


def test_status_bar_says_stale_when_the_api_fails_and_backs_off(lab, browser):
    answers = canned(time.time())
    failing = {"on": False}

    def answer(route):
        if failing["on"]:
            route.fulfill(status=500, content_type="application/json",
                          body='{"message": "Internal Server Error"}')  # fmt: skip
            return
        path = route.request.url.split(API, 1)[1].split("?", 1)[0]
        route.fulfill(status=200, content_type="application/json", body=json.dumps(answers[path]))

    pg = open_lab(browser, lab, answer)
    item = pg.locator("[data-gpulab=status]")
    pg.wait_for_function("() => document.querySelector('[data-gpulab=status]').textContent"
                         ".includes('GiB')")  # fmt: skip
    assert item.inner_text().strip() == "2 GPUs 43% · 50.1/119 GiB"

    failing["on"] = True
    pg.wait_for_function(
        "() => document.querySelector('[data-gpulab=status]').textContent.includes('stale')",
        timeout=15_000,
    )
    failed_at = time.monotonic()
    assert item.inner_text().strip() == "GPU — stale (HTTP 500)"
    assert "jp-gpulab-level-stale" in item.get_attribute("class")
    assert "GiB" not in item.inner_text()  # the old numbers are not shown as if current
    title = item.get_attribute("title")
    assert title.startswith("GPU status is stale: The server did not answer: 500 ")
    assert "Last known numbers, from " in title and "GPU 0: NVIDIA H100 80GB HBM3" in title
    color = item.evaluate("n => getComputedStyle(n).color")
    pg.screenshot(path=str(OUT / "lab-status-bar-stale.png"))
    pg.locator("#jp-main-statusbar").screenshot(path=str(OUT / "lab-status-bar-stale-bar.png"))

    # backing off: at 2 s a poll, 10 s would be 5 more requests; with backoff (each wait
    # at least 2 s, up to 3 times the last) there are fewer. (Counted, not timed: the
    # request events reach this process late when the machine is busy.)
    pg.wait_for_timeout(10_000)
    later = [t for t, p in pg.api_requests if p == "gpu" and t > failed_at]
    assert len(later) <= 4, [round(t - failed_at, 1) for t in later]

    # the panel keeps the last numbers greyed, dated and under the reason
    item.click()
    notice = pg.locator("[data-gpulab=stale]")
    notice.wait_for(timeout=30_000)
    assert notice.inner_text().startswith("Stale: The server did not answer: 500 ")
    assert "The numbers below are from " in notice.inner_text()
    assert pg.locator(".jp-gpulab-is-stale .jp-gpulab-Card").count() == 2
    pg.wait_for_timeout(300)
    pg.screenshot(path=str(OUT / "lab-gpu-panel-stale.png"))

    # the server answers again: a click on the item tries at once (rather than after the
    # backoff), and the numbers are current again
    failing["on"] = False
    answers.update(canned(time.time()))
    item.click()
    pg.wait_for_function(
        "() => document.querySelector('[data-gpulab=status]').textContent.includes('GiB')",
        timeout=10_000,
    )
    assert "jp-gpulab-level-stale" not in item.get_attribute("class")
    assert pg.locator("[data-gpulab=stale]").count() == 0
    assert item.evaluate("n => getComputedStyle(n).color") != color
    pg.close()


def test_status_bar_says_no_access_when_the_server_refuses(lab, browser):
    # A collaborator whose access was revoked: the project's server answers 403. The
    # status bar says so in words, not "stale (HTTP 403)", and the panel shows no GPU.
    answers = canned(time.time())
    refusing = {"on": False}

    def answer(route):
        if refusing["on"]:
            route.fulfill(status=403, content_type="application/json",
                          body='{"message": "Forbidden"}')  # fmt: skip
            return
        path = route.request.url.split(API, 1)[1].split("?", 1)[0]
        route.fulfill(status=200, content_type="application/json", body=json.dumps(answers[path]))

    pg = open_lab(browser, lab, answer)
    item = pg.locator("[data-gpulab=status]")
    pg.wait_for_function("() => document.querySelector('[data-gpulab=status]').textContent"
                         ".includes('GiB')")  # fmt: skip
    refusing["on"] = True
    pg.wait_for_function(
        "() => document.querySelector('[data-gpulab=status]').textContent.includes('no access')",
        timeout=15_000,
    )
    assert item.inner_text().strip() == "GPU — no access"
    assert item.get_attribute("title") == "You no longer have access to this project"
    pg.locator("#jp-main-statusbar").screenshot(path=str(OUT / "lab-status-bar-no-access.png"))
    item.click()
    notice = pg.locator("[data-gpulab=no-access]")
    notice.wait_for(timeout=30_000)
    assert notice.inner_text() == "You no longer have access to this project."
    assert pg.locator(".jp-gpulab-Card").count() == 0  # the project's GPUs are not shown
    pg.wait_for_timeout(300)
    pg.screenshot(path=str(OUT / "lab-gpu-panel-no-access.png"))
    pg.close()


def test_status_bar_says_stale_when_the_sampler_reports_an_error(lab, browser):
    answers = canned(time.time())
    answers["gpu"].update(stale=True, error="NVMLError_GpuIsLost: GPU is lost",
                          error_since=time.time(), last_ok=answers["gpu"]["timestamp"])  # fmt: skip

    def answer(route):
        path = route.request.url.split(API, 1)[1].split("?", 1)[0]
        route.fulfill(status=200, content_type="application/json", body=json.dumps(answers[path]))

    pg = open_lab(browser, lab, answer)
    pg.wait_for_function(
        "() => document.querySelector('[data-gpulab=status]').textContent.includes('stale')",
        timeout=30_000,
    )
    assert item_text(pg) == "GPU — stale (sampler error)"
    title = pg.locator("[data-gpulab=status]").get_attribute("title")
    assert "The server's GPU sampler failed: NVMLError_GpuIsLost: GPU is lost" in title
    pg.close()


def test_the_panel_says_shared_gpu_on_wsl2_not_stale(lab, browser):
    """WSL2 (gpulab_hub/gpus/wsl.py): the status names the sharing; NVML there measures no
    utilisation and no process, and its failing reads are that, not a fault to retry."""
    answers = canned(time.time())
    words = "shared GPU (WSL2) — utilisation not available"
    answers["gpu"].update(
        sharing={"mode": "wsl2-shared", "words": words}, stale=True,
        error="NVMLError_NotSupported: Not Supported", error_since=time.time(),
        gpus=[{**answers["gpu"]["gpus"][0], "utilization": None}],
    )  # fmt: skip

    def answer(route):
        path = route.request.url.split(API, 1)[1].split("?", 1)[0]
        route.fulfill(status=200, content_type="application/json", body=json.dumps(answers[path]))

    pg = open_lab(browser, lab, answer)
    pg.locator("[data-gpulab=status]").click()
    panel = pg.locator("[data-gpulab=panel]")
    panel.locator("[data-gpulab=shared]").wait_for(timeout=30_000)
    assert panel.locator("[data-gpulab=shared]").inner_text() == words
    assert panel.locator("[data-gpulab=stale]").count() == 0
    assert panel.locator(".jp-gpulab-Card").count() == 1
    text = panel.inner_text()
    assert "Per-process GPU memory is not available on WSL2." in text
    assert "No process holds GPU memory" not in text and "Retrying" not in text
    pg.close()


def test_a_hidden_tab_stops_polling_and_resumes_when_shown(lab, browser):
    pg = open_lab(browser, lab)  # the real server (no canned answers)
    pg.wait_for_function(
        "() => !document.querySelector('[data-gpulab=status]').textContent.includes('…')",
        timeout=30_000,
    )
    pg.wait_for_timeout(4_500)
    visible = [t for t, p in pg.api_requests if p == "gpu"]
    assert len(visible) >= 3, visible  # polling every 2 s while shown

    set_visibility(pg, "hidden")
    hidden_at = time.monotonic()
    pg.wait_for_timeout(8_000)
    while_hidden = [(round(t - hidden_at, 1), p) for t, p in pg.api_requests if t > hidden_at]
    # @lumino/polling lingers one tick before it stands by: at most one request of each
    # poll (the GPU status, the status bar's running cells), where 8 s at 2 s a poll
    # would be four
    paths = [p for _, p in while_hidden]
    assert all(paths.count(p) <= 1 for p in paths), while_hidden
    assert pg.evaluate("document.visibilityState") == "hidden"

    set_visibility(pg, "visible")
    shown_at = time.monotonic()
    pg.wait_for_timeout(1_000)
    assert [t for t, p in pg.api_requests if p == "gpu" and t > shown_at], "no poll when shown"
    pg.close()


# -- A project that runs its last good image, on a host without GPUs -------------------------
# The environment gpulab's hub gives a project container on this machine after the
# Dockerfile's latest build failed: its base image says the host has no GPU
# (GPULAB_HOST_GPUS=""), the container got none, and the image is the last one that built.
NOTE = "Running the last image that built (at 09:12): the Dockerfile's latest build failed."
LOG_PATH = "/hub/gpulab/build-log/dana/vision?build=7"
LAST_GOOD_ENV = {
    "GPULAB_HOST_GPUS": "",
    "NVIDIA_VISIBLE_DEVICES": "void",
    "GPULAB_IMAGE_STATE": "last-good",
    "GPULAB_IMAGE_NOTE": NOTE,
    "GPULAB_BUILD_LOG_URL": LOG_PATH,
}


@pytest.fixture(scope="module")
def last_good_lab(tmp_path_factory):
    with running_lab(tmp_path_factory.mktemp("lab-last-good"), LAST_GOOD_ENV) as running:
        yield running


def test_last_good_image_is_told_where_the_user_looks(last_good_lab, browser):
    url, token, _ = last_good_lab
    info = requests.get(f"{url}/api/gpulab/v1/info", params={"token": token}, timeout=5).json()
    assert info["image_state"] == {"state": "last-good", "note": NOTE, "build_log_url": LOG_PATH}
    pg = browser.new_page(viewport={"width": 1400, "height": 860})
    pg.goto(f"{url}/lab?token={token}", wait_until="domcontentloaded")

    # A notification when JupyterLab opens, with the way to the build log.
    toast = pg.locator(".Toastify__toast").filter(has_text=NOTE)
    toast.wait_for(timeout=90_000)
    pg.wait_for_timeout(500)
    pg.screenshot(path=str(OUT / "lab-last-good-notification.png"))
    with pg.context.expect_page() as opened:
        toast.get_by_role("button", name="Open build log").click()
    log_page = opened.value
    assert log_page.url == url + LOG_PATH  # hub and server share the origin here
    log_page.close()

    # A status bar item that stays, and a line in the GPU panel.
    item = pg.locator("#jp-main-statusbar [data-gpulab=image-state]")
    assert item.inner_text().strip() == "Last good image"
    assert item.get_attribute("title").startswith(NOTE)
    pg.locator("[data-gpulab=status]").click()
    line = pg.locator("[data-gpulab=panel] [data-gpulab=last-good]")
    line.wait_for(timeout=30_000)
    assert line.inner_text().startswith(NOTE)
    assert line.get_by_role("link", name="Open build log").get_attribute("href") == LOG_PATH

    # No GPU on this host: the panel says so (not "ask for a GPU": there is none to ask for).
    box = pg.locator("[data-gpulab=panel] .jp-gpulab-NoGpu")
    box.wait_for(timeout=15_000)
    assert box.get_attribute("data-reason") == "no_driver"
    assert box.locator("h3").inner_text() == "No NVIDIA driver"
    assert (
        box.locator(".jp-gpulab-Reason")
        .inner_text()
        .startswith("This host has no NVIDIA driver: gpulab found no GPU on it")
    )
    hint = box.locator(".jp-gpulab-Hint").inner_text()
    assert hint.startswith("Your code runs on the CPU. For a GPU, whoever runs gpulab needs")
    assert "GPUs for this project" not in hint
    pg.wait_for_timeout(300)
    pg.screenshot(path=str(OUT / "lab-last-good-panel.png"))
    pg.close()
