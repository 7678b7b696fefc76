"""Jobs in JupyterLab, through Debian's Chromium: the Jobs panel, Run as job, the
notification when a job ends, and the idle notice with "Keep it running".

A plain `jupyter lab` from .venv (no hub, no Docker), as in
test_lab_extension_browser.py, with a short idle timeout (GPULAB_IDLE_TIMEOUT) so
that the notice comes within seconds. Jobs run for real in the lab's folder
(gpulab_jupyter/jobs/local.py). Screenshots go to test-output/; the Jobs panel's
also to docs/img/jobs-panel.png (docs/jobs.md shows it).
"""

from __future__ import annotations

import json
import re
import time

import pytest
import requests
from playwright.sync_api import Error as PlaywrightError
from test_lab_extension_browser import (
    ARGS,
    CHROMIUM,
    GIB,
    H100,
    OUT,
    REPO,
    canned,
    running_lab,
    set_visibility,
)

pytestmark = pytest.mark.browser

IDLE_TIMEOUT = 30  # seconds: the notice shows from 15 s before the stop
TRAIN = """\
import time

print("loading data", flush=True)
for epoch in range(1, 10_000):
    print(f"epoch {epoch} loss {1 / epoch:.4f}", flush=True)
    time.sleep(0.4)
"""
QUICK = 'print("quick job done")\n'
FAIL = 'import sys\n\nprint("no data here")\nsys.exit(3)\n'
NOTEBOOK = {
    "cells": [{"cell_type": "code", "execution_count": None, "id": "c1", "metadata": {},
               "outputs": [], "source": "print(6 * 7)"}],
    "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                "name": "python3"}},
    "nbformat": 4, "nbformat_minor": 5,
}  # fmt: skip


# The file browser's entries (jupyter-collaboration's Online Collaborators panel lists
# open files with the same class).
FILES = "#filebrowser .jp-DirListing-item"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    home = tmp_path_factory.mktemp("jobs-lab")
    project = home / "project"  # the file browser shows the project's files only
    project.mkdir()
    (project / "train.py").write_text(TRAIN)
    (project / "quick.py").write_text(QUICK)
    (project / "fail.py").write_text(FAIL)
    (project / "hello.ipynb").write_text(json.dumps(NOTEBOOK))
    env = {
        "GPULAB_IDLE_TIMEOUT": str(IDLE_TIMEOUT),
        "GPULAB_PROJECT_DIR": str(project),
        # as gpulab's spawner names the project it serves (the tab title says it)
        "GPULAB_PROJECT": "alice-first",
        "GPULAB_PROJECT_DISPLAY_NAME": "Alice First",
    }
    # Running jobs are counted as activity every second (every 30 s by default).
    args = ("--ActivityReporter.every_s=1",)
    with running_lab(home, env, root=project, args=args) as (url, token, log):
        yield url, token, log, project
        # Jobs outlive their server: none is left running after the tests.
        jobs = requests.get(f"{url}/api/gpulab/v1/jobs", params={"token": token}, timeout=30)
        for job in jobs.json()["jobs"]:
            if job["state"] in ("starting", "running"):
                requests.post(f"{url}/api/gpulab/v1/jobs/{job['id']}/stop",
                              params={"token": token}, timeout=60)  # fmt: skip


@pytest.fixture(scope="module")
def page(lab):
    from playwright.sync_api import sync_playwright

    url, token, _, _ = lab
    OUT.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        pg = browser.new_page(viewport={"width": 1400, "height": 860})
        pg.errors = []
        pg.on("pageerror", lambda e: pg.errors.append(str(e)))
        pg.goto(f"{url}/lab?token={token}", wait_until="domcontentloaded")
        pg.wait_for_selector("#jp-main-statusbar", timeout=90_000)
        yield pg
        browser.close()


def api(lab, path: str, method: str = "GET") -> dict:
    url, token, _, _ = lab
    r = requests.request(method, f"{url}/api/gpulab/v1/{path}", params={"token": token}, timeout=30)
    r.raise_for_status()
    return r.json()


def run_from_file_browser(page, name: str) -> None:
    """Right-click ``name`` in the file browser, then "Run as job"."""
    item = page.locator(FILES).filter(has=page.get_by_text(name, exact=True))
    selected = page.locator(f"{FILES}.jp-mod-selected .jp-DirListing-itemText")
    if not item.is_visible():  # the Jobs panel has the sidebar: show the file browser
        page.locator('.jp-SideBar .lm-TabBar-tab[data-id="filebrowser"]').click()
    for _ in range(3):
        item.click(button="right")
        # The listing redraws its rows in place when a file or folder appears (jobs/):
        # a right-click that landed on the row as it changed selected another file.
        if selected.count() == 1 and selected.inner_text().strip() == name:
            break
        page.keyboard.press("Escape")
        page.wait_for_timeout(500)
    page.locator(".lm-Menu-item").filter(has_text=re.compile(r"^Run as job$")).click()


def show_jobs_panel(page):
    """The Jobs panel, from its tab in the left sidebar (a click on the tab of the panel
    on show would close the sidebar)."""
    panel = page.locator("[data-gpulab=jobs-panel]")
    tab = page.locator('.jp-SideBar .lm-TabBar-tab[data-id="gpulab-jobs"]')
    tab.wait_for(timeout=30_000)
    for _ in range(3):  # the layout of a page just opened may still be restored
        if panel.is_visible():
            break
        tab.click()
        page.wait_for_timeout(1_000)
    panel.wait_for(state="visible", timeout=30_000)
    return panel


def job_item(page, state: str | None = None):
    sel = "[data-gpulab=jobs-panel] .jp-gpulab-Job"
    return page.locator(f"{sel}[data-state={state}]" if state else sel)


def test_a_job_runs_shows_its_output_and_stops(lab, page):
    # The Jobs panel, from its tab in the left sidebar: no job yet, and how to start one.
    panel = show_jobs_panel(page)
    page.wait_for_function(
        "() => document.querySelector('[data-gpulab=jobs-panel]').textContent"
        ".includes('No jobs yet')",
        timeout=30_000,
    )
    assert "choose Run as job" in panel.inner_text()

    # The file browser shares the sidebar: it comes back, right-click train.py, Run as job.
    run_from_file_browser(page, "train.py")
    # ...and the Jobs panel opens on the job, running, its output coming in.
    running = job_item(page, "running")
    running.wait_for(timeout=30_000)
    assert panel.is_visible()
    job_id = running.get_attribute("data-job-id")
    assert "jp-mod-focus" in running.get_attribute("class")
    assert running.locator(".jp-gpulab-JobTitle").inner_text() == "train.py"
    assert "train.py" in running.locator(".jp-gpulab-JobCommand").inner_text()
    output = running.locator("[data-gpulab=job-output]")
    page.wait_for_function(
        """id => /epoch [3-9]/.test(document.querySelector(
            `[data-job-id="${id}"] [data-gpulab=job-output]`).textContent)""",
        arg=job_id,
        timeout=30_000,
    )
    assert "loading data" in output.inner_text() or "epoch" in output.inner_text()
    assert running.locator("[data-gpulab=job-gpu]").inner_text()  # this host: "No GPU in …"
    # The elapsed time ticks between polls.
    elapsed = running.locator("[data-gpulab=job-elapsed]")
    first = elapsed.inner_text()
    assert re.fullmatch(r"\d+s", first), first
    page.wait_for_timeout(2_200)
    assert elapsed.inner_text() != first
    assert api(lab, f"jobs/{job_id}")["state"] == "running"
    # The project would stop when idle; the job keeps it running, and the panel says so
    # in words that say what that means, and (on pointing at them) what comes after.
    kept = panel.locator("[data-gpulab=jobs-kept]")
    kept.wait_for(timeout=15_000)
    assert kept.inner_text() == "A job is running, so this project is not stopped for being idle."
    assert kept.get_attribute("title") == (
        f"Once nothing keeps it, the project stops after {IDLE_TIMEOUT} seconds with no "
        "browser activity, job, running cell or GPU use, and its GPUs go to others. "
        "Your files stay."
    )
    deadline = time.monotonic() + 15
    while "job" not in api(lab, "activity")["kept_by"] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "job" in api(lab, "activity")["kept_by"]
    page.wait_for_timeout(1_500)  # a few more lines of output
    page.screenshot(path=str(OUT / "jobs-panel.png"))
    doc_image = REPO / "docs" / "img" / "jobs-panel.png"
    panel.locator(".jp-gpulab-JobsBody").screenshot(path=str(doc_image))

    # Stop: the job ends as "stopped", for the server too; Re-run is offered.
    running.locator("[data-gpulab=job-stop]").click()
    stopped = job_item(page, "stopped")
    stopped.wait_for(timeout=30_000)
    assert stopped.get_attribute("data-job-id") == job_id
    assert stopped.locator("[data-gpulab=job-state]").inner_text().lower() == "stopped"
    assert stopped.locator("[data-gpulab=job-rerun]").is_visible()
    assert stopped.locator("[data-gpulab=job-stop]").count() == 0
    assert api(lab, f"jobs/{job_id}")["state"] == "stopped"
    page.wait_for_function(
        "() => !document.querySelector('[data-gpulab=jobs-kept]')", timeout=30_000
    )  # nothing keeps the project now

    # Open log: the job's output.log in JupyterLab, with what it printed.
    stopped.locator("[data-gpulab=job-log]").click()
    tab = page.locator(".jp-MainAreaWidget:visible .cm-content")
    tab.wait_for(timeout=30_000)
    page.wait_for_function(
        "() => [...document.querySelectorAll('.lm-DockPanel-tabBar .lm-TabBar-tabLabel')]"
        ".some(t => t.textContent === 'output.log')"
    )
    page.wait_for_function(
        "() => [...document.querySelectorAll('.jp-MainAreaWidget .cm-content')]"
        ".some(c => c.textContent.includes('epoch 2 loss'))",
        timeout=15_000,
    )
    page.screenshot(path=str(OUT / "jobs-open-log.png"))
    assert not [e for e in page.errors if "gpulab" in e.lower()], page.errors


def test_the_jobs_tab_is_named_and_a_command_job_shows_its_command_line(lab, page):
    # The Jobs tab in the left sidebar reads "Jobs", not an unlabelled icon.
    tab = page.locator('.jp-SideBar .lm-TabBar-tab[data-id="gpulab-jobs"]')
    tab.wait_for(timeout=30_000)
    assert tab.locator(".lm-TabBar-tabLabel").inner_text().strip() == "Jobs"
    assert tab.locator(".lm-TabBar-tabLabel").is_visible()
    # A command job (gpulab-job run -- bash -c '…'): the panel shows the command as it
    # was typed, each word quoted as a shell reads it back, not the job's id.
    url, token, _, _ = lab
    words = ["bash", "-c", 'echo "it\'s done"; sleep 60']
    r = requests.post(f"{url}/api/gpulab/v1/jobs", params={"token": token},
                      json={"command": words}, timeout=30)  # fmt: skip
    assert r.status_code == 201, r.text
    job = r.json()
    typed = """bash -c 'echo "it'"'"'s done"; sleep 60'"""
    assert job["command_line"] == f"-- {typed}"
    try:
        panel = show_jobs_panel(page)
        item = panel.locator(f'[data-job-id="{job["id"]}"]')
        item.wait_for(timeout=30_000)
        assert item.locator("[data-gpulab=job-title]").inner_text() == typed
        assert job["id"] not in item.inner_text()
        # Shown whole (it wraps), not cut off.
        shown = item.locator("[data-gpulab=job-title]")
        assert shown.evaluate("e => e.scrollWidth <= e.clientWidth")
        item.locator("[data-gpulab=job-title]").screenshot(path=str(OUT / "jobs-command-title.png"))
        page.screenshot(path=str(OUT / "jobs-command.png"))
    finally:
        assert api(lab, f"jobs/{job['id']}/stop", "POST")["state"] == "stopped"


def test_the_browser_tab_names_the_project_once(lab, page):
    # A document open: "train.py — Alice First — gpulab".
    item = page.locator(FILES).filter(has=page.get_by_text("train.py", exact=True))
    if not item.is_visible():  # the Jobs panel has the sidebar: show the file browser
        page.locator('.jp-SideBar .lm-TabBar-tab[data-id="filebrowser"]').click()
    item.dblclick()
    page.wait_for_function("() => document.title.startsWith('train.py')", timeout=60_000)
    title = page.title()  # "train.py (2)" where an earlier test left one view open
    assert title.endswith(" — Alice First — gpulab") and title.count("Alice First") == 1, title
    # JupyterLab's title with no document is "JupyterLab": the tab then reads the
    # project's name alone, once (gpulab's own title must not be rewritten again).
    title = page.evaluate(
        """async () => {
            document.title = 'JupyterLab';
            await new Promise(done => setTimeout(done, 100));  // the observers have run
            return document.title;
        }"""
    )
    assert title == "Alice First — gpulab"


def test_a_job_that_ends_is_announced(lab, page):
    run_from_file_browser(page, "quick.py")
    toast = page.locator(".Toastify__toast").filter(has_text="Job quick.py succeeded after")
    toast.wait_for(timeout=30_000)
    assert re.search(r"Job quick\.py succeeded after \d+s", toast.inner_text())
    assert toast.get_by_role("button", name="Open log").is_visible()
    done = job_item(page, "succeeded")
    assert "quick job done" in done.locator("[data-gpulab=job-output]").inner_text()
    page.wait_for_timeout(1_000)  # the toast slides in
    page.screenshot(path=str(OUT / "jobs-ended-notification.png"))
    toast.get_by_role("button", name="Open log").click()
    page.wait_for_function(
        "() => [...document.querySelectorAll('.jp-MainAreaWidget .cm-content')]"
        ".some(c => c.textContent.includes('quick job done'))",
        timeout=15_000,
    )

    # A failed one says its exit code (and stays until closed).
    run_from_file_browser(page, "fail.py")
    failed = page.locator(".Toastify__toast").filter(has_text="Job fail.py failed")
    failed.wait_for(timeout=30_000)
    assert re.search(r"Job fail\.py failed \(exit code 3\) after \d+s", failed.inner_text())
    item = job_item(page, "failed")
    assert "Failed with exit code 3" in item.inner_text()
    assert "no data here" in item.locator("[data-gpulab=job-output]").inner_text()
    failed.get_by_role("button", name="Hide notification").click()
    failed.wait_for(state="detached", timeout=10_000)


def test_a_jobs_gpu_memory_shows_on_it(lab, page):
    # This host has no GPU: the GPU routes answer as on a GPU host where the server
    # found the job's process on GPU 0 (docs/gpu-status-api.md, "job").
    url, token, _, _ = lab
    r = requests.post(f"{url}/api/gpulab/v1/jobs", params={"token": token},
                      json={"target": "train.py", "name": "on the GPU"}, timeout=30)  # fmt: skip
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    answers = canned(time.time())
    answers["gpu/processes"]["processes"] = [
        {"pid": 530, "name": "python", "command": "python -u train.py", "kernel": None,
         "job": job_id, "gpus": [{"uuid": H100, "index": 0, "memory_used": int(11.2 * GIB),
                                  "match": "pid"}]},
    ]  # fmt: skip

    def answer(route):
        path = route.request.url.split("/api/gpulab/v1/", 1)[1].split("?", 1)[0]
        route.fulfill(status=200, content_type="application/json", body=json.dumps(answers[path]))

    page.route("**/api/gpulab/v1/gpu**", answer)
    try:
        show_jobs_panel(page)
        gpu = page.locator(f'[data-job-id="{job_id}"] [data-gpulab=job-gpu]')
        page.wait_for_function(
            """id => (document.querySelector(`[data-job-id="${id}"] [data-gpulab=job-gpu]`)
                      || {}).textContent?.includes('in 1 process')""",
            arg=job_id,
            timeout=30_000,
        )
        assert gpu.inner_text() == (
            "GPU 0: 11.2 GiB in 1 process · GPU use of the project: 2 GPUs 43% · 50.1/119 GiB"
        )
        title = page.locator(f'[data-job-id="{job_id}"] .jp-gpulab-JobTitle').inner_text()
        assert title == "on the GPU"
        page.screenshot(path=str(OUT / "jobs-panel-gpu.png"))
    finally:
        page.unroute("**/api/gpulab/v1/gpu**")
        assert api(lab, f"jobs/{job_id}/stop", "POST")["state"] == "stopped"


REFUSAL = "You can read this project, but not change or run anything here. Save a copy."


def test_a_viewer_is_offered_no_run_stop_or_rerun(lab, page):
    # Where the server refuses (a viewer under gpulab's hub), its words are shown.
    def refuse(route):
        route.fulfill(status=403, content_type="application/json",
                      body=json.dumps({"message": REFUSAL, "reason": None}))  # fmt: skip

    page.route("**/api/gpulab/v1/jobs/*/rerun*", refuse)
    try:
        show_jobs_panel(page)
        job_item(page, "stopped").first.locator("[data-gpulab=job-rerun]").click()
        toast = page.locator(".Toastify__toast").filter(has_text=REFUSAL)
        toast.wait_for(timeout=15_000)
        assert re.match(r"Re-run .+: " + re.escape(REFUSAL), toast.inner_text().strip())
    finally:
        page.unroute("**/api/gpulab/v1/jobs/*/rerun*")

    # A viewer's JupyterLab (the server's info says what it refuses them): the jobs and
    # their output, Open log, and nothing that starts or stops one.
    url, token, _, _ = lab
    info = api(lab, "info")
    viewer = page.context.browser.new_page(viewport={"width": 1400, "height": 860})
    viewer.route("**/api/gpulab/v1/info*", lambda route: route.fulfill(
        status=200, content_type="application/json", body=json.dumps({**info, "refusal": REFUSAL})
    ))  # fmt: skip
    viewer.goto(f"{url}/lab?token={token}", wait_until="domcontentloaded")
    viewer.wait_for_selector("#jp-main-statusbar", timeout=90_000)
    panel = show_jobs_panel(viewer)
    job_item(viewer).first.wait_for(timeout=30_000)
    assert job_item(viewer).count() >= 3
    assert panel.locator("[data-gpulab=job-log]").count() == job_item(viewer).count()
    assert panel.locator("[data-gpulab=job-rerun], [data-gpulab=job-stop]").count() == 0
    viewer.locator('.jp-SideBar .lm-TabBar-tab[data-id="filebrowser"]').click()
    item = viewer.locator(FILES).filter(
        has=viewer.get_by_text("train.py", exact=True)
    )
    item.click(button="right")
    menu = viewer.locator(".lm-Menu-content").first
    menu.wait_for()
    assert "Open With" in menu.inner_text() and "Run as job" not in menu.inner_text()
    viewer.close()


def test_idle_notice_and_keep_it_running(lab, page):
    # A tab in front asks the server for updates, which counts as use: in the
    # background it asks nothing but when the project stops, and the notice comes.
    set_visibility(page, "hidden")
    notice = page.locator(".Toastify__toast").filter(has_text="This project stops at")
    notice.wait_for(timeout=60_000)
    text = notice.inner_text()
    assert re.search(r"This project stops at \d\d:\d\d if it stays idle \(no browser activity, "
                     r"job, running cell or GPU use\)", text), text  # fmt: skip
    activity = api(lab, "activity")
    # nothing keeps it beyond its last use: no job runs (a running one would)
    assert activity["idle_timeout"] == IDLE_TIMEOUT
    assert not [j for j in api(lab, "jobs")["jobs"] if j["state"] in ("starting", "running")]
    # the time said is when it stops: within the idle time from now
    soon = {time.strftime("%H:%M", time.localtime(time.time() + s)) for s in (0, IDLE_TIMEOUT)}
    assert re.search(r"stops at (\d\d:\d\d)", text)[1] in soon, (text, soon)
    page.wait_for_timeout(1_000)
    page.screenshot(path=str(OUT / "jobs-idle-notice.png"))

    notice.get_by_role("button", name="Keep it running").click()
    notice.wait_for(state="detached", timeout=10_000)
    activity = api(lab, "activity")
    assert "keep" in activity["kept_by"]
    assert activity["stop_at"] > time.time() + IDLE_TIMEOUT / 2
    set_visibility(page, "visible")


def test_a_notebook_runs_as_job_from_its_toolbar(lab, page):
    project = lab[3]
    page.locator('.jp-SideBar .lm-TabBar-tab[data-id="filebrowser"]').click()
    item = page.locator(FILES).filter(has=page.get_by_text("hello.ipynb"))
    item.dblclick()
    button = page.locator(".jp-NotebookPanel-toolbar [data-jp-item-name=gpulab-run-as-job]")
    button.wait_for(timeout=60_000)
    button.locator("button").click()
    # The Jobs panel opens on it; it ends, announced, with the executed notebook.
    toast = page.locator(".Toastify__toast").filter(has_text="Job hello.ipynb succeeded after")
    try:
        toast.wait_for(timeout=90_000)
    except PlaywrightError:
        page.screenshot(path=str(OUT / "jobs-run-notebook-failure.png"))
        raise
    assert toast.get_by_role("button", name="Open executed notebook").is_visible()
    done = job_item(page, "succeeded").first
    assert done.locator(".jp-gpulab-JobTitle").inner_text() == "hello.ipynb"
    job_id = done.get_attribute("data-job-id")
    executed = f"hello.job-{job_id}.ipynb"
    assert (project / executed).is_file()
    done.locator("[data-gpulab=job-notebook]").click()
    page.locator(".lm-DockPanel-tabBar .lm-TabBar-tabLabel", has_text=executed).wait_for(
        timeout=30_000
    )
    page.locator(".jp-NotebookPanel:visible .jp-OutputArea-output", has_text="42").wait_for(
        timeout=30_000
    )
    page.wait_for_timeout(500)
    page.screenshot(path=str(OUT / "jobs-notebook.png"))
    assert not [e for e in page.errors if "gpulab" in e.lower()], page.errors
