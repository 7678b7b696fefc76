"""Words a person meets in a real project on the session hub (issue 24): every hub page
names the project by its display name ("Alice First"), with the short name in small
print where it must be typed; a terminal's prompt names the project's host, not a
container ID; ``nvidia-smi`` in a project without a GPU says why in plain words."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from playwright.sync_api import expect
from security.people import log_in_admin, make_user, password

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("show_logs_on_failure")]

OWNER, PROJECT, TITLE = "nmalice", "first", "Alice First"
# What a terminal's login shell shows and runs (JupyterLab's terminals: bash -l).
SHELL = r"""
import json, subprocess
def run(line, how="-lc"):
    p = subprocess.run(["/bin/bash", how, line], capture_output=True, text=True, timeout=30)
    return {"rc": p.returncode, "out": p.stdout, "err": p.stderr}
print("RESULT " + json.dumps({
    "hostname": run("hostname"),
    "prompt": run('echo "${PS1@P}"', "-lic"),
    "smi": run("nvidia-smi"),
    "which": run("command -v nvidia-smi"),
    "host_gpus": run('printf %s "$GPULAB_HOST_GPUS"'),
}))
"""


@pytest.fixture(scope="module")
def alice(hub):
    user = make_user(hub, log_in_admin(hub), OWNER)
    yield user
    user.api("DELETE", f"/hub/api/users/{OWNER}/servers/{PROJECT}", json={"remove": True})


def page(user, path: str, status: int = 200) -> str:
    r = user.http.get(f"{user.base}{path}", timeout=30, allow_redirects=False)
    assert r.status_code == status, (path, r.status_code, r.text[:2000])
    return r.text


def heading(html: str) -> str:
    """The page's first <h1>, tags and spaces folded (what a person reads)."""
    found = re.search(r"<h1[^>]*>(.*?)</h1>", html, re.S)
    assert found, html[:2000]
    return " ".join(re.sub(r"<[^>]+>", " ", found.group(1)).split())


def test_the_start_progress_page_names_the_project(alice):
    # the hub answers the start when the project is ready (or after 10 s): the progress
    # page is read while that request waits
    with ThreadPoolExecutor(1) as pool:
        started = pool.submit(
            alice.api,
            "POST",
            f"/hub/api/users/{OWNER}/servers/{PROJECT}",
            json={"display_name": TITLE},
            timeout=120,
        )
        deadline = time.monotonic() + 60
        while True:
            url = f"{alice.base}/hub/spawn-pending/{OWNER}/{PROJECT}"
            r = alice.http.get(url, timeout=30, allow_redirects=False)
            if r.status_code == 200 and "gpulab-spawn-pending" in r.text:
                break
            assert not started.done() and time.monotonic() < deadline, (r.status_code, r.text)
            time.sleep(0.1)
        assert started.result().status_code in (201, 202), started.result().text
    html = r.text
    assert heading(html) == f"Starting project {TITLE}"
    assert f"<title>Starting {TITLE}</title>" in html
    assert f"var project = {json.dumps(TITLE)};" in html  # its script's words too
    alice.wait_ready(PROJECT)


def test_a_terminal_names_the_projects_host_and_nvidia_smi_says_why_no_gpu(alice):
    alice.wait_ready(PROJECT)
    out = alice.execute(PROJECT, SHELL, timeout=120)
    got = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[7:])
    assert got["hostname"]["out"].strip() == PROJECT, got
    assert "jovyan@first" in got["prompt"]["out"], got
    # the project was given no GPU (CI's host has none): gpulab's stand-in answers
    smi = got["smi"]
    assert got["which"]["out"].strip() == "/usr/local/bin/nvidia-smi", got
    assert smi["rc"] == 9 and smi["out"] == "", smi
    assert smi["err"].startswith("nvidia-smi: this project has no GPU"), smi
    if got["host_gpus"]["out"] == "":
        assert "the machine gpulab runs on has none" in smi["err"], smi
    else:
        assert "it was started without one" in smi["err"], smi
        assert "choose how many GPUs it gets" in smi["err"], smi


def test_share_secrets_and_ssh_pages_name_the_project(alice):
    share = page(alice, f"/hub/gpulab/share/{PROJECT}")
    assert heading(share) == f"Share {TITLE}"
    ssh = page(alice, "/hub/gpulab/ssh")
    row = re.search(rf'<li class="ssh-connect[^>]*data-project="{PROJECT}".*?</li>', ssh, re.S)
    assert row, ssh[:3000]
    assert f"<strong>{TITLE}</strong>" in row.group(0)
    assert f"{OWNER}+{PROJECT}@" in row.group(0)  # the login to type keeps the short name
    xsrf = alice.http.cookies.get("_xsrf", path="/hub/")
    form = {"_xsrf": xsrf, "action": "add", "name": "NM_TOKEN", "value": "v"}
    added = alice.http.post(f"{alice.base}/hub/gpulab/secrets", data=form, timeout=30)
    assert added.status_code == 200, added.text[:2000]
    card = re.search(r'<h3 class="h5 card-title">(.*?)</h3>', added.text, re.S)
    assert card, added.text[:3000]
    assert " ".join(re.sub(r"<[^>]+>", " ", card.group(1)).split()) == f"{TITLE} ({PROJECT})"
    assert f"Save for {TITLE}</button>" in added.text


def test_start_form_and_not_running_pages_name_the_project(alice):
    alice.stop_project(PROJECT)
    form = page(alice, f"/hub/spawn/{OWNER}/{PROJECT}")
    assert heading(form) == f"Start project {TITLE} ({PROJECT})"
    assert f"Start {TITLE}</button>" in form
    stopped = page(alice, f"/hub/user/{OWNER}/{PROJECT}/", status=424)
    assert heading(stopped) == f"Project {TITLE} is not running"


def test_a_display_name_is_text_on_the_pages_never_markup(hub, alice):
    """A display name is the owner's free text: pages show it escaped."""
    name = "nm-markup"
    r = alice.api("POST", f"/hub/api/users/{OWNER}/servers/{name}",
                  json={"display_name": "<b>bold</b>"})  # fmt: skip
    assert r.status_code in (201, 202), r.text  # gpulab takes it as a display name
    try:
        alice.stop_project(name)
        html = page(alice, f"/hub/spawn/{OWNER}/{name}")
        assert "<b>bold</b>" not in html and "&lt;b&gt;bold&lt;/b&gt;" in html
    finally:
        alice.api("DELETE", f"/hub/api/users/{OWNER}/servers/{name}", json={"remove": True})


@pytest.mark.browser
def test_the_delete_dialog_names_the_project_and_asks_for_its_short_name(hub, alice, browser):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(20_000)
    pg = context.new_page()
    try:
        pg.goto(f"{hub.url}/hub/login")
        pg.get_by_label("Username").fill(OWNER)
        pg.get_by_label("Password").fill(password(OWNER))
        pg.get_by_role("button", name="Sign In").click()
        expect(pg).to_have_url(f"{hub.url}/hub/home")
        pg.locator(f'tr.project[data-project="{PROJECT}"] .delete-project').click()
        dialog = pg.locator("#delete-dialog")
        expect(dialog.locator("#delete-title")).to_have_text(f"Delete {TITLE}?")
        expect(dialog.locator("code.delete-name")).to_have_text(PROJECT)
        submit = dialog.locator("#delete-submit")
        dialog.locator("#delete-confirm").fill(TITLE)  # the display name is not the name
        expect(submit).to_be_disabled()
        dialog.locator("#delete-confirm").fill(PROJECT)
        expect(submit).to_be_enabled()
        dialog.locator("#delete-cancel").click()
    finally:
        context.close()
