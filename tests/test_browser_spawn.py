"""Starting a project that does not build, in Chromium, as its owner sees it.

One project, whose Dockerfile gains ``RUN false`` after a first good build:

1. a start from the project's address (GET) fails within a second or two; the page says
   the project did not start, why, the end of the build log, links to the whole log
   (which the owner can read, ANSI-free) and offers building again or the last image;
2. "Build the Dockerfile again" from the spawn form (a POST) ends on the same page with
   the same choices (JupyterHub used to show another project's form and "HTTP 500");
   a build that fails while the progress shows says so on the progress page first;
3. "Start the last image that built": the progress says so, JupyterLab opens, and the
   container's environment tells the project's user (GPULAB_IMAGE_STATE and friends);
4. the Dockerfile fixed from there: the next start's form ticks building it again, and
   Start runs the fix.

Screenshots: test-output/spawn-*.png.
"""

from __future__ import annotations

import re
import time

import pytest
from browser_kit import SHOTS
from hubclient import HubUser
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, expect
from security.people import log_in_admin, make_user, password

pytestmark = [
    pytest.mark.browser,
    pytest.mark.docker,
    pytest.mark.usefixtures("show_logs_on_failure"),
]

VIEWPORT = {"width": 1280, "height": 900}
USER, PROJECT = "spawnsam", "mendme"
# A step that fails at once, and prints colour codes first (the log page drops them)
BROKEN = "RUN printf '\\033[31mred-step-output\\033[0m\\n' && false\n"
SLOW_BROKEN = "RUN echo slow-step-output && sleep 3 && false\n"
# What the owner writes instead, from inside the last image that built
FIXED = "RUN echo fixed > /opt/gpulab/fixed.txt\n"


@pytest.fixture
def page(request, browser):
    """One browser page (own cookies), screenshotted when the test fails."""
    SHOTS.mkdir(exist_ok=True)
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(15_000)
    p = context.new_page()
    yield p
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        try:
            p.screenshot(path=SHOTS / "spawn-failure.png")
            print(f"\npage at failure: {p.url} (test-output/spawn-failure.png)")
        except PlaywrightError:
            pass
    context.close()


@pytest.fixture(scope="module")
def owner(hub):
    """A user whose project built once (so it has a last good image), then stopped."""
    user = make_user(hub, log_in_admin(hub), USER)
    user.start_project(PROJECT)
    user.stop_project(PROJECT)
    yield user
    if PROJECT in user.api("GET", f"/hub/api/users/{USER}").json()["servers"]:
        user.stop_project(PROJECT)


def shot(p: Page, name: str) -> None:
    p.screenshot(path=SHOTS / name, full_page=True)


def log_in(p: Page, base: str) -> None:
    p.goto(f"{base}/hub/login")
    p.get_by_label("Username").fill(USER)
    p.get_by_label("Password").fill(password(USER))
    p.get_by_role("button", name="Sign In").click()
    p.wait_for_url(re.compile(r"/hub/(home|spawn)"))


def expect_build_failure_page(p: Page) -> None:
    """The page of a failed build: heading, reason, log tail, link, choices."""
    expect(p.get_by_role("heading", name=f"Project {PROJECT} did not start")).to_be_visible(
        timeout=30_000
    )
    failure = p.locator("#gpulab-failure")
    expect(failure).to_contain_text(f"The Dockerfile of project {PROJECT} failed to build")
    tail = failure.locator("pre.gpulab-log-tail")
    expect(tail).to_contain_text("red-step-output")
    expect(tail).to_contain_text("returned a non-zero code: 1")
    expect(failure.get_by_role("link", name="Open the whole build log")).to_be_visible()
    expect(p.get_by_role("button", name="Build the Dockerfile again")).to_be_visible()
    expect(p.get_by_role("button", name="Start the last image that built")).to_be_visible()
    # the same Dockerfile would fail again: the last image that built is the first choice
    expect(p.locator("#gpulab-choices button").first).to_have_text(
        "Start the last image that built"
    )
    for bare in ("Unhandled error", "Spawn failed", "HTTP 500", "Relaunch"):
        expect(p.get_by_text(bare)).to_have_count(0)


def container_env(docker_engine) -> dict[str, str]:
    found = docker_engine.call(
        "containers", filters={"label": [f"gpulab.owner={USER}", f"gpulab.project={PROJECT}"]}
    )
    assert len(found) == 1, found
    env = docker_engine.call("inspect_container", found[0]["Id"])["Config"]["Env"]
    return dict(item.partition("=")[::2] for item in env)


def test_a_dockerfile_that_fails_fast(hub, docker_engine, owner: HubUser, page: Page):
    base = hub.url
    dockerfile = hub.home / "projects" / USER / PROJECT / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + BROKEN)
    log_in(page, base)

    # 1. Start it from its address: the spawn page (a GET starts nothing), its button.
    page.goto(f"{base}/hub/spawn/{USER}/{PROJECT}")
    started = time.monotonic()
    page.get_by_role("button", name=f"Start {PROJECT}").click()
    expect_build_failure_page(page)
    waited = time.monotonic() - started
    print(f"\nclick to the reason of a fast build failure: {waited:.1f} s")
    assert waited < 30
    shot(page, "spawn-01-build-failed.png")

    # The whole log, for the owner: plain text, no colour codes.
    page.get_by_role("link", name="Open the whole build log").click()
    expect(page).to_have_url(re.compile(rf"/hub/gpulab/build-log/{USER}/{PROJECT}$"))
    expect(page.get_by_role("heading", name=f"Build log of {PROJECT}")).to_be_visible()
    log = page.locator("#gpulab-build-log")
    expect(log).to_contain_text("red-step-output")
    expect(log).to_contain_text("returned a non-zero code: 1")
    # the step's coloured output is plain text (its command line shows the codes it prints)
    assert "\x1b" not in log.text_content() and "\nred-step-output\n" in log.text_content()
    shot(page, "spawn-02-build-log.png")

    # 2. The spawn form now offers the choice, the last image that built ticked (the same
    # Dockerfile would fail again); "Build the Dockerfile again" (a POST).
    page.goto(f"{base}/hub/spawn/{USER}/{PROJECT}")
    expect(page.get_by_role("heading", name=f"Start project {PROJECT}")).to_be_visible()
    expect(page.get_by_label("Start the last image that built (")).to_be_checked()
    expect(page.get_by_label("Build the Dockerfile again")).not_to_be_checked()
    shot(page, "spawn-03-form.png")
    page.get_by_label("Build the Dockerfile again").check()
    page.get_by_role("button", name=f"Start {PROJECT}").click()
    expect_build_failure_page(page)
    shot(page, "spawn-04-build-failed-again.png")

    # A build that fails later, while the spawn page shows the progress: that page says
    # so itself, then the failure page with the choices follows.
    dockerfile.write_text(dockerfile.read_text().replace(BROKEN, SLOW_BROKEN))
    page.get_by_role("button", name="Build the Dockerfile again").click()
    page.wait_for_url(re.compile(rf"/hub/spawn-pending/{USER}/{PROJECT}"))
    expect(page.get_by_role("heading", name=f"Starting project {PROJECT}")).to_be_visible()
    told = page.locator("#gpulab-start-failure")
    expect(told).to_contain_text("slow-step-output", timeout=30_000)
    expect(page.locator("#gpulab-start-heading")).to_have_text(f"Project {PROJECT} did not start")
    shot(page, "spawn-05-failed-while-watching.png")
    expect(page.locator("#gpulab-failure")).to_contain_text("slow-step-output")
    expect(page.get_by_role("button", name="Start the last image that built")).to_be_visible()

    # 3. Start the last image that built: the progress says so, JupyterLab opens.
    page.get_by_role("button", name="Start the last image that built").click()
    page.wait_for_url(re.compile(rf"/(hub/spawn-pending|user)/{USER}/{PROJECT}"))
    assert "/spawn-pending/" in page.url, "JupyterLab opened before the progress showed"
    expect(page.get_by_role("heading", name=f"Starting project {PROJECT}")).to_be_visible()
    expect(page.locator("#gpulab-start-note")).to_contain_text(
        "Starting the last image that built (", timeout=10_000
    )
    expect(page.locator("#gpulab-start-note")).to_contain_text("the Dockerfile's build of")
    page.get_by_text("Event log").click()
    shot(page, "spawn-06-last-good-progress.png")
    page.wait_for_url(f"**/user/{USER}/{PROJECT}/lab**", timeout=90_000)
    expect(page.locator("#filebrowser").get_by_text("Dockerfile", exact=True)).to_be_visible(
        timeout=60_000
    )
    # In JupyterLab: a notification with the note and the build log, and a status item.
    item = page.locator("[data-gpulab=image-state]")
    expect(item).to_have_text("Last good image")
    # The note whole: the hub's note is longer than the 140 characters JupyterLab's
    # notifications keep, so the notification says it in one whole sentence and the
    # status bar item carries the note (which image, when the build failed).
    toast = page.locator(".Toastify__toast").filter(has_text="Running the last image that built")
    expect(toast).to_be_visible(timeout=15_000)
    expect(toast).to_contain_text(
        "Running the last image that built: the Dockerfile's latest build failed. "
        "Fix the Dockerfile, then restart the project."
    )
    expect(toast).not_to_contain_text("…")
    expect(item).to_have_attribute("title", re.compile(r"^Running the last image that built \("))
    expect(item).to_have_attribute("title", re.compile(r"build of .* failed\."))
    expect(page.get_by_role("button", name="Open build log").first).to_be_visible()
    # No prompt about Jupyter's news in front of the user's work (the image turns it off).
    page.wait_for_timeout(2_000)  # JupyterLab asks, when it does, with its first toasts
    expect(page.get_by_text("official Jupyter news")).to_have_count(0)
    shot(page, "spawn-07-lab-last-good.png")

    env = container_env(docker_engine)
    assert env["GPULAB_IMAGE_STATE"] == "last-good"
    assert env["GPULAB_IMAGE_NOTE"].startswith("Running the last image that built (")
    assert "the Dockerfile's build of " in env["GPULAB_IMAGE_NOTE"]
    assert env["GPULAB_IMAGE_NOTE"].endswith(" failed.")
    assert env["GPULAB_BUILD_LOG_URL"] == f"/hub/gpulab/build-log/{USER}/{PROJECT}"
    assert env["GPULAB_PROJECT"] == PROJECT

    # 4. The Dockerfile fixed from inside the last image that built, the project stopped,
    # started again from its spawn page: now building the fixed Dockerfile is the choice
    # that is ticked (and comes first), so the big button starts the fix, not the old image.
    owner.execute(
        PROJECT,
        "from pathlib import Path\n"
        "p = Path('/workspace/Dockerfile')\n"
        f"p.write_text(p.read_text().replace({SLOW_BROKEN!r}, {FIXED!r}))",
    )
    assert FIXED in dockerfile.read_text() and SLOW_BROKEN not in dockerfile.read_text()
    owner.stop_project(PROJECT)
    page.goto(f"{base}/hub/spawn/{USER}/{PROJECT}")
    expect(page.get_by_role("heading", name=f"Start project {PROJECT}")).to_be_visible()
    rebuild = page.get_by_label("Build the Dockerfile again with its changes")
    expect(rebuild).to_be_checked()
    expect(page.get_by_label("Start the last image that built (")).not_to_be_checked()
    expect(page.locator("input[name=image_choice]").first).to_have_attribute("value", "rebuild")
    expect(page.locator("#gpulab-build-failed-note")).to_contain_text("has changed since")
    shot(page, "spawn-08-form-after-fix.png")
    page.get_by_role("button", name=f"Start {PROJECT}").click()
    page.wait_for_url(f"**/user/{USER}/{PROJECT}/lab**", timeout=300_000)
    expect(page.locator("#jp-main-statusbar")).to_be_visible(timeout=60_000)
    expect(
        page.locator("[data-gpulab=image-state]").filter(has_text="Last good image")
    ).to_have_count(0)
    env = container_env(docker_engine)
    assert env["GPULAB_IMAGE_STATE"] == "latest"
    assert owner.execute(PROJECT, "print(open('/opt/gpulab/fixed.txt').read())").strip() == "fixed"
    shot(page, "spawn-09-lab-fixed.png")
