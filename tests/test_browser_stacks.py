"""A new project's starting point, as its owner sees it (Chromium, the shared hub).

The home page's "New project" form offers the starting points; "Data science" with
"Create and start" opens JupyterLab where pandas, scikit-learn, matplotlib and tqdm
import. A second Data-science project reuses the stack's layer (Docker's cache: same
parent image, same line); a PyTorch project keeps the base image's torch (pip fetches
none); an unknown starting point is refused in words.

Screenshots: docs/img/new-project-stacks.png, test-output/stacks-*.png.
"""

from __future__ import annotations

import html
import re
import time

import pytest
from browser_kit import DOCS_IMG, SHOTS
from hubclient import HubUser
from playwright.sync_api import Page, expect
from security.people import log_in_admin, make_user, password

pytestmark = [
    pytest.mark.browser,
    pytest.mark.docker,
    pytest.mark.usefixtures("show_logs_on_failure"),
]

USER = "stacksam"
DS, DS2, PT = "tables", "tables-again", "nets"


@pytest.fixture(scope="module")
def owner(hub):
    user = make_user(hub, log_in_admin(hub), USER)
    yield user
    servers = user.api("GET", f"/hub/api/users/{USER}").json()["servers"]
    for name in servers:
        user.stop_project(name)


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(15_000)
    yield context.new_page()
    context.close()


def build_log(user: HubUser, project: str) -> str:
    """The project's latest build log as its owner reads it: the hub's build-log page in
    the owner's logged-in session (the page takes a login, not an API token)."""
    r = user.http.get(
        f"{user.base}/hub/gpulab/build-log/{USER}/{project}", allow_redirects=False, timeout=30
    )
    assert r.status_code == 200, (r.status_code, r.headers.get("Location"))
    r.encoding = "utf-8"  # as the page's <meta charset> tells a browser
    assert "Only its last" not in r.text  # the whole log is shown
    m = re.search(r'<pre id="gpulab-build-log"[^>]*>(.*?)</pre>', r.text, re.S)
    assert m, r.text[-2000:]
    return html.unescape(m.group(1))


def stack_step(log: str, first_requirement: str) -> dict:
    """The build log's step of the starting point's RUN line (the one whose pip install
    begins with ``first_requirement``): whether Docker took it from its cache, and the
    image layer it made or reused (Docker's classic builder's lines)."""
    m = re.search(
        r"^Step \d+/\d+ : RUN python -m pip install --no-cache-dir "
        + re.escape(first_requirement)
        + r".*\n((?:.*\n)*?) ---> ([0-9a-f]{12})$",
        log,
        re.M,
    )
    assert m, log
    return {"cache": m.group(1) == " ---> Using cache\n", "layer": m.group(2)}


def create_and_start(user: HubUser, project: str, stack: str) -> float:
    """Through the REST API, as the home page does: PUT with the starting point, then a
    start without options (the one chosen at creation is kept). Seconds to ready."""
    r = user.api(
        "PUT",
        f"/hub/api/users/{USER}/servers/{project}",
        json={"display_name": project, "user_options": {"stack": stack}},
    )
    assert r.status_code == 201, r.text
    started = time.monotonic()
    user.start_project(project, timeout=900)
    return time.monotonic() - started


def test_a_data_science_project_from_the_home_page(hub, owner: HubUser, page: Page):
    base = hub.url
    page.goto(f"{base}/hub/login")
    page.get_by_label("Username").fill(USER)
    page.get_by_label("Password").fill(password(USER))
    page.get_by_role("button", name="Sign In").click()
    page.wait_for_url(re.compile(r"/hub/home"))

    choices = page.locator("#new-project-stack")
    expect(choices.get_by_text("Starting point", exact=True)).to_be_visible()
    expect(
        page.get_by_role("radio", name="Minimal:")
    ).to_be_checked()  # what a new project had before
    expect(page.locator("label[for=stack-data-science]")).to_contain_text(
        "pandas, matplotlib, scikit-learn and tqdm"
    )
    expect(page.locator("label[for=stack-pytorch]")).to_contain_text("the base image's own")
    expect(page.locator("label[for=stack-huggingface]")).to_contain_text(
        "transformers, datasets, accelerate"
    )
    page.get_by_label("New project").fill("Tables")
    page.get_by_role("radio", name="Data science:").check()
    page.locator("#new-project").screenshot(path=DOCS_IMG / "new-project-stacks.png")

    started = time.monotonic()
    page.get_by_role("button", name="Create and start", exact=True).click()
    page.wait_for_url(f"**/user/{USER}/{DS}/lab**", timeout=900_000)
    expect(page.locator("#filebrowser").get_by_text("Dockerfile", exact=True)).to_be_visible(
        timeout=60_000
    )
    first = time.monotonic() - started
    print(f"\nData science, first build (click to JupyterLab's file browser): {first:.1f} s")
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=SHOTS / "stacks-lab.png")

    out = owner.execute(
        DS,
        "import pandas, sklearn, matplotlib, tqdm\n"
        "print(pandas.__version__, sklearn.__version__, matplotlib.__version__, "
        "tqdm.__version__)",
        timeout=120,
    )
    assert out.split() == ["3.1.1", "1.9.1", "3.11.2", "4.70.1"], out
    text = (hub.home / "projects" / USER / DS / "Dockerfile").read_text()
    assert "# Starting point: Data science. Change or remove these lines freely." in text
    assert text.index("pandas==3.1.1") < text.index(">>> gpulab managed block")

    # A second project from the same starting point: its stack's layer is the first one's.
    again = create_and_start(owner, DS2, "data-science")
    print(f"Data science, second project (cached layer): {again:.1f} s")
    built, reused = (
        stack_step(build_log(owner, DS), "pandas=="),
        stack_step(log := build_log(owner, DS2), "pandas=="),
    )
    assert reused["cache"], log  # Docker says " ---> Using cache" for the stack's RUN step
    assert reused["layer"] == built["layer"], (built, reused)  # the very same image layer
    assert "Collecting" not in log  # pip ran no second time
    assert again < first
    owner.stop_project(DS2)


def test_a_pytorch_project_keeps_the_base_images_torch(hub, owner: HubUser):
    took = create_and_start(owner, PT, "pytorch")
    print(f"\nPyTorch, first build (REST start to ready): {took:.1f} s")
    log = build_log(owner, PT)
    assert not stack_step(log, '"torch>=2"')["cache"], log  # this build ran pip
    # pip kept the base image's CPU build of torch and fetched no other
    assert re.search(
        r"^Requirement already satisfied: torch>=2 in \S+ \(2\.[^)]*\+cpu\)$", log, re.M
    ), log
    assert not re.search(r"^\s*(Collecting|Downloading) torch\b|torch-\d[^ ]*\.whl", log, re.M), log
    out = owner.execute(PT, "import torch, tqdm\nprint(torch.__version__)", timeout=120)
    assert out.strip().endswith("+cpu"), out  # the test base's CPU wheel, not PyPI's
    owner.stop_project(PT)


def test_an_unknown_starting_point_is_refused(hub, owner: HubUser):
    # Made through the REST API with a starting point gpulab does not offer, then started:
    # the start says which ones there are, and nothing is built or written.
    r = owner.api(
        "PUT",
        f"/hub/api/users/{USER}/servers/odd",
        json={"display_name": "odd", "user_options": {"stack": "x"}},
    )
    assert r.status_code == 201, r.text
    r = owner.api("POST", f"/hub/api/users/{USER}/servers/odd", json={})
    assert r.status_code == 400, r.text
    said = r.json()["message"]
    assert "gpulab has no starting point 'x'; choose one of 'minimal' (Minimal), " in said, said
    assert "'data-science' (Data science)" in said and "'huggingface' (Hugging Face)" in said

    # Started with a near miss of a real one (a space for the hyphen): refused the same way.
    r = owner.api("POST", f"/hub/api/users/{USER}/servers/odder", json={"stack": "data science"})
    assert r.status_code == 400, r.text
    assert "gpulab has no starting point 'data science'" in r.json()["message"]

    servers = owner.api("GET", f"/hub/api/users/{USER}").json()["servers"]
    for name in ("odd", "odder"):
        assert not (servers.get(name) or {}).get("ready"), servers
        assert not (hub.home / "projects" / USER / name / "Dockerfile").exists()
