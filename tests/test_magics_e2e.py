"""End to end: %gpu_install in a spawned project container writes the project's
Dockerfile on the host, and the image rebuilt at the next start has the package.

The install is typed into a notebook in JupyterLab, in Debian's Chromium (through
Playwright), as a user does it; the notebook is saved, read back through the
contents API, and shown again after a reload: what was saved is a readable
summary, not a widget that died with the kernel. Screenshot:
test-output/magics-saved-summary.png.

The package comes from PyPI (project containers and image builds reach it); it is
a tiny pure-Python one, pinned.
"""

from __future__ import annotations

import json
import os
from urllib.parse import quote

import pytest
from browser_kit import CHROMIUM_BINARY, SHOTS, launch
from hubclient import HubUser

pytestmark = [
    pytest.mark.docker,
    pytest.mark.browser,
    pytest.mark.usefixtures("show_logs_on_failure"),
]

NOTEBOOK = "install.ipynb"
PASSWORD = "mona-Passw0rd-long"

PACKAGE, VERSION, MODULE = "iniconfig", "2.0.0", "iniconfig"
LINE = (
    f"RUN python -m pip install --no-cache-dir {PACKAGE}=={VERSION} && python -c 'import {MODULE}'"
)


@pytest.fixture(scope="module")
def mona(hub):
    admin = HubUser(hub.url, "admin", hub.admin_password)
    assert admin.login().status_code == 302
    admin.new_token()
    user = HubUser(hub.url, "mona", PASSWORD)
    assert user.signup().status_code == 200
    assert admin.authorize("mona").status_code == 200
    assert user.login().status_code == 302
    user.new_token()
    return user


def container_id(docker_engine, name: str) -> str:
    found = docker_engine.call("containers", filters={"name": name})
    assert len(found) == 1, found
    return found[0]["Id"]


def test_gpu_install_in_a_container_is_rebuilt_into_the_image(hub, mona, docker_engine):
    from conftest import PREFIX

    project = hub.home / "projects" / "mona" / "magic"
    mona.start_project("magic")
    first = container_id(docker_engine, f"{PREFIX}-mona--magic")
    before = (project / "Dockerfile").read_text()

    # The magics are loaded by the image's IPython config: no %load_ext here.
    absent = mona.execute(
        "magic", f"import importlib.util; print(importlib.util.find_spec('{MODULE}'))"
    )
    assert absent.strip() == "None"
    install_in_jupyterlab(hub.url, mona)

    after = (project / "Dockerfile").read_text()
    assert [ln for ln in after.splitlines() if ln not in before.splitlines()] == [LINE]
    logs = list((project / ".gpulab" / "logs").glob(f"gpu_install-*-{PACKAGE}.log"))
    assert logs, "the install log is kept in the project"

    diff = mona.execute("magic", "%gpu_diff")
    assert "Everything installed here is in the Dockerfile." in diff, diff
    info = mona.execute("magic", "%gpu_info")
    assert "No NVIDIA GPU is visible here" in info or "compute capability" in info

    mona.stop_project("magic")
    mona.start_project("magic")  # a new Dockerfile: the image is rebuilt
    assert container_id(docker_engine, f"{PREFIX}-mona--magic") != first
    out = mona.execute(
        "magic",
        f"import {MODULE}, importlib.metadata as m; print(m.version('{PACKAGE}'), "
        f"{MODULE}.__file__)",
    )
    version, path = out.split()
    assert version == VERSION
    assert path.startswith("/opt/gpulab/venv/")
    # Installed by the image build (before this container started): nothing to record.
    assert "Everything installed here is in the Dockerfile." in mona.execute("magic", "%gpu_diff")
    mona.stop_project("magic")


def saved_outputs(mona: HubUser) -> list[dict]:
    r = mona.api("GET", f"/user/mona/magic/api/contents/{quote(NOTEBOOK)}")
    assert r.status_code == 200, r.text
    return [o for cell in r.json()["content"]["cells"] for o in cell.get("outputs", [])]


def install_in_jupyterlab(base: str, mona: HubUser) -> None:
    """mona types the install into a new notebook, runs it, saves it, reloads the page."""
    from playwright.sync_api import expect, sync_playwright

    assert os.path.exists(CHROMIUM_BINARY), "Debian's chromium is not installed"
    SHOTS.mkdir(exist_ok=True)
    done = f"✔ {PACKAGE} {VERSION}: installed, verified and written to the Dockerfile"
    with sync_playwright() as pw:
        browser = launch(pw)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.set_default_timeout(30_000)
        try:
            page.goto(f"{base}/hub/login")
            page.get_by_label("Username").fill("mona")
            page.get_by_label("Password").fill(PASSWORD)
            page.get_by_role("button", name="Sign In").click()
            page.wait_for_url("**/hub/**")
            page.goto(f"{base}/user/mona/magic/lab")
            expect(page.locator("#jp-main-dock-panel")).to_be_visible(timeout=90_000)
            page.locator(".jp-LauncherCard[data-category=Notebook]").first.click()
            panel = page.locator(".jp-NotebookPanel:visible")
            expect(page.locator("#jp-main-statusbar")).to_contain_text("| Idle", timeout=60_000)
            panel.locator(".jp-Cell").first.locator(".cm-content").click()
            page.keyboard.insert_text(f"%gpu_install {PACKAGE}=={VERSION}")
            page.keyboard.press("Shift+Enter")
            outputs = panel.locator(".jp-Cell").first.locator(".jp-OutputArea")
            # While it runs: the live widget with its stages.
            expect(outputs).to_contain_text("%gpu_install", timeout=60_000)
            # At the end: the summary replaced the widget, then what was written where.
            expect(outputs).to_contain_text(done, timeout=300_000)
            expect(outputs).to_contain_text("✔ done in")
            page.keyboard.press("Control+s")
            rename = page.locator(".jp-Dialog")
            rename.locator("input[type=text]").fill(NOTEBOOK)
            rename.get_by_role("button", name="Rename and Save").click()
            expect(page.get_by_role("tab", name=NOTEBOOK)).to_be_visible()

            # What was saved (the contents API, as anyone who opens it later gets it).
            saved = saved_outputs(mona)
            text = json.dumps(saved, ensure_ascii=False)
            kinds = {m for o in saved for m in o.get("data", {})}
            assert "application/vnd.jupyter.widget-view+json" not in kinds, kinds
            assert "VBox(children=" not in text and "\\u001b" not in text, text
            assert "CUDA architectures" not in text, text
            assert done in text and "✔ done in" in text and "Full log: " in text, text

            # After a reload (no widget state anywhere), the summary is what one reads.
            page.reload()
            expect(page.locator("#jp-main-dock-panel")).to_be_visible(timeout=90_000)
            page.locator("#filebrowser").get_by_text(NOTEBOOK, exact=True).dblclick()
            panel = page.locator(".jp-NotebookPanel:visible")
            outputs = panel.locator(".jp-Cell").first.locator(".jp-OutputArea")
            expect(outputs).to_contain_text(done, timeout=30_000)
            expect(outputs).to_contain_text(f"%gpu_install {PACKAGE}=={VERSION}: ✔ done in")
            expect(outputs).not_to_contain_text("VBox(")
            expect(outputs).not_to_contain_text("Error displaying widget")
            outputs.get_by_text("Log, last").click()  # the log tail opens
            expect(outputs).to_contain_text(f"Successfully installed {PACKAGE}-{VERSION}")
            news = page.get_by_role("button", name="No", exact=True)
            if news.count():  # JupyterLab's "Jupyter news?" toast, over the page
                news.first.click()
                page.wait_for_timeout(800)  # it slides away
            page.screenshot(path=SHOTS / "magics-saved-summary.png")
        except BaseException:
            page.screenshot(path=SHOTS / "magics-failure.png")
            raise
        finally:
            browser.close()
