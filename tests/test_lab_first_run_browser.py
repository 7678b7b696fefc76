"""The first Shift+Enter in a new notebook always runs, in a project's JupyterLab.

Thirty notebooks made the ways people make them (the Launcher's Python 3 card, File >
New > Notebook, the file browser's + then the card, a copy by the file browser's
Duplicate), ten right after the project's first start, ten after a page reload (the
browser reconnects), ten after a restart of the project; in each, ``print(n)`` typed as
soon as the cell takes typing and Shift+Enter pressed once, never waiting for the
kernel. Each prints within 10 s. Before gpulab's cell executor (extensions/src/firstrun.ts)
most of them ran nothing: JupyterLab dropped a run pressed while the kernel was still
starting. The timings are printed (-s) and kept in test-output/first-run-timings.txt; screenshots:
test-output/first-run-*.png.
"""

from __future__ import annotations

import pytest
from browser_kit import SHOTS
from first_run_kit import (
    BLANK,
    WAYS,
    Run,
    blank_notebook,
    close_current,
    decline_news,
    first_shift_enter,
    lab_ready,
)
from playwright.sync_api import Error as PlaywrightError
from security.people import log_in_admin, make_user, password

pytestmark = [
    pytest.mark.browser,
    pytest.mark.docker,
    pytest.mark.usefixtures("show_logs_on_failure"),
]

USER, PROJECT = "firstrun", "first-run"
PHASES = ("fresh start", "page reload", "project restart")
PER_PHASE = 10  # 30 notebooks in all
TOTAL = len(PHASES) * PER_PHASE


@pytest.fixture(scope="module")
def owner(hub):
    user = make_user(hub, log_in_admin(hub), USER)
    yield user
    if PROJECT in user.api("GET", f"/hub/api/users/{USER}").json()["servers"]:
        user.stop_project(PROJECT)


@pytest.fixture
def page(request, browser):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(20_000)
    p = context.new_page()
    yield p
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        try:
            p.screenshot(path=SHOTS / "first-run-failure.png")
        except PlaywrightError:
            pass
    context.close()


def put_blank(owner) -> None:
    body = {"type": "notebook", "format": "json", "content": blank_notebook()}
    r = owner.api("PUT", f"/user/{USER}/{PROJECT}/api/contents/{BLANK}", json=body)
    assert r.status_code in (200, 201), r.text


def shut_down_kernels(owner) -> None:
    """The notebook's kernel goes (as "Shut Down All" does): the next one starts alone."""
    server = f"/user/{USER}/{PROJECT}/api/sessions"
    for session in owner.api("GET", server).json():
        owner.api("DELETE", f"{server}/{session['id']}")


def test_the_first_shift_enter_in_a_new_notebook_always_runs(hub, owner, page):
    base = hub.url.rstrip("/")
    owner.start_project(PROJECT)  # the project's first start
    put_blank(owner)
    page.goto(f"{base}/hub/login")
    page.get_by_label("Username").fill(USER)
    page.get_by_label("Password").fill(password(USER))
    page.get_by_role("button", name="Sign In").click()
    page.wait_for_url(f"{base}/hub/home")
    page.goto(f"{base}/user/{USER}/{PROJECT}/lab")
    lab_ready(page)
    decline_news(page)

    runs: list[tuple[str, Run]] = []
    shot = False
    for p, phase in enumerate(PHASES):
        if phase == "page reload":
            page.reload()
            lab_ready(page)
        elif phase == "project restart":
            owner.stop_project(PROJECT)
            owner.start_project(PROJECT)
            page.reload()
            lab_ready(page)
        for i in range(PER_PHASE):
            n = len(runs) + 1
            way = WAYS[(p + i) % len(WAYS)]
            run = first_shift_enter(page, way, n)
            if run.output_s is not None and not shot:
                page.screenshot(path=SHOTS / "first-run-printed.png")
                shot = True
            runs.append((phase, run))
            close_current(page)
            shut_down_kernels(owner)

    table = [f"first Shift+Enter in {TOTAL} new notebooks (seconds):"]
    table.append(f"{'#':>3} {'after':<16} {'made by':<13} {'editable':>8} {'printed':>8}")
    for n, (phase, run) in enumerate(runs, 1):
        printed = "LOST" if run.output_s is None else f"{run.output_s:.2f}"
        table.append(f"{n:>3} {phase:<16} {run.way:<13} {run.editable_s:>8.2f} {printed:>8}")
    lost = [(n, phase, run.way) for n, (phase, run) in enumerate(runs, 1) if run.output_s is None]
    table.append(f"{len(lost)} of {TOTAL} lost")
    print("\n" + "\n".join(table))
    (SHOTS / "first-run-timings.txt").write_text("\n".join(table) + "\n")
    assert not lost, f"{len(lost)} of {TOTAL} first Shift+Enters ran nothing: {lost}"
