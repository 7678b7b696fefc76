"""Every starting point is ready before anyone asks (images/prebuild.py), on a hub of its
own that builds two of them after `gpulab up` (GPULAB_PREBUILD=data-science,pytorch:
Data science's pip step takes tens of seconds, a window to start a project in while it
builds; the session hub builds none: a CI machine's minutes).

Its new projects' Dockerfile (the site's own template, set in jupyterhub_config.d) is
gpulab's with one line more after FROM, a LABEL unique to this run: no layer another
test built (test_browser_stacks.py's Data science project, an earlier run) fits below it,
so the starting points' steps run here, whatever the engine's cache held before.

What the admin and a user notice: the admin page's "Starting points" say where each is
(waiting, building step N of M, ready); a user who creates a Data science project while
that starting point is being built is told so on the spawn page and then gets its layers; a
PyTorch project made later starts without running the starting point's pip step (the
build log's "Using cache"), and its torch is the CPU one (this host has no GPU): no
CUDA torch, no nvidia-* package.
"""

from __future__ import annotations

import html
import re
import threading
import time
import uuid
from pathlib import Path

import pytest
from conftest import PREFIX, hub_env, print_container_logs, start_hub
from hubclient import HubUser
from security.people import log_in_admin, make_user

pytestmark = pytest.mark.docker

USER = "prebo"
ROW = re.compile(
    r'<tr class="admin-starting-point" data-name="([a-z-]+)" data-state="([a-z]+)">\s*'
    r"<td>([^<]*)</td>\s*<td class=\"small\">([^<]*)",
)


@pytest.fixture(scope="module")
def prehub(docker_engine, tmp_path_factory, request):
    home = tmp_path_factory.mktemp("gpulab-prebuild-home")
    own_template(home, f"gpulab test run {uuid.uuid4().hex}")
    points = "data-science,pytorch"
    env = hub_env(home, GPULAB_CONTAINER_PREFIX=PREFIX + "pre", GPULAB_PREBUILD=points)
    h = start_hub(home, env)
    yield h
    if request.session.testsfailed:
        print("\n----- hub log (last 80 lines) -----\n" + "\n".join(h.log.splitlines()[-80:]))
        print_container_logs(docker_engine)
    down = h.gpulab("down")
    assert down.returncode == 0, down.stderr


def own_template(home: Path, marker: str) -> None:
    """A site template of new projects' Dockerfile: gpulab's, with a LABEL ``marker``
    right after FROM (a site's lines in $GPULAB_HOME/jupyterhub_config.d)."""
    folder = home / "templates"
    folder.mkdir(mode=0o755)
    text = (Path(__file__).parents[1] / "images" / "project.Dockerfile.j2").read_text()
    start = "FROM {{ base_image }}\n"
    assert text.count(start) == 1, text
    (folder / "project.Dockerfile.j2").write_text(
        text.replace(start, f'{start}LABEL gpulab.test.run="{marker}"\n')
    )
    site = home / "jupyterhub_config.d"
    site.mkdir(mode=0o755)
    (site / "50-template.py").write_text(f"c.ProjectSpawner.images_dir = {str(folder)!r}\n")
    (site / "50-template.py").chmod(0o644)


@pytest.fixture(scope="module")
def admin(prehub) -> HubUser:
    return log_in_admin(prehub)


@pytest.fixture(scope="module")
def owner(prehub, admin) -> HubUser:
    user = make_user(prehub, admin, USER)
    yield user
    for name in user.api("GET", f"/hub/api/users/{USER}").json()["servers"]:
        user.stop_project(name)


def starting_points(admin: HubUser) -> dict[str, tuple[str, str]]:
    """The admin page's Starting points: {name: (state, the words shown)}."""
    r = admin.http.get(f"{admin.base}/hub/gpulab/admin", timeout=30)
    assert r.status_code == 200, r.text[-2000:]
    return {
        name: (state, " ".join(html.unescape(words).split()))
        for name, state, _label, words in ROW.findall(r.text)
    }


def build_log(user: HubUser, project: str) -> str:
    r = user.http.get(f"{user.base}/hub/gpulab/build-log/{USER}/{project}", timeout=30)
    assert r.status_code == 200, r.status_code
    m = re.search(r'<pre id="gpulab-build-log"[^>]*>(.*?)</pre>', r.text, re.S)
    assert m, r.text[-2000:]
    return html.unescape(m.group(1))


def step_of(words: str) -> int:
    """N of the admin page's "Building: step N of M (...)", 0 before its first step."""
    m = re.match(r"Building: step (\d+) of \d+", words)
    return int(m.group(1)) if m else 0


def run_steps(log: str) -> list[tuple[str, bool]]:
    """Each RUN step of a build log (Docker's classic builder): (its line, taken from
    the cache)."""
    steps = re.findall(r"^Step \d+/\d+ : (RUN .*)\n((?:.*\n)*?) ---> [0-9a-f]{12}$", log, re.M)
    return [(line, body.startswith(" ---> Using cache")) for line, body in steps]


def create(user: HubUser, project: str, stack: str) -> None:
    r = user.api(
        "PUT",
        f"/hub/api/users/{USER}/servers/{project}",
        json={"display_name": project, "user_options": {"stack": stack}},
    )
    assert r.status_code == 201, r.text


def test_the_starting_points_build_after_the_start_and_a_new_project_waits_for_its_own(
    prehub, admin, owner
):
    seen: dict[str, list[tuple[str, str]]] = {"data-science": [], "pytorch": []}
    said: list[dict] = []
    started: dict[str, float] = {}
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        points = starting_points(admin)
        assert list(points) == ["data-science", "pytorch"], points  # GPULAB_PREBUILD's
        for name, shown in points.items():
            if not seen[name] or seen[name][-1] != shown:
                seen[name].append(shown)
        point = points["data-science"]
        if point[0] == "building" and step_of(point[1]) >= 3 and "start" not in started:
            # a user makes a Data science project while that starting point's pip runs
            # (step 3: after FROM and the LABEL)
            create(owner, "tables", "data-science")
            r = owner.api("POST", f"/hub/api/users/{USER}/servers/tables", json={})
            assert r.status_code in (201, 202), r.text
            started["start"] = time.monotonic()
            # what its spawn page shows as it comes (JupyterHub's progress stream)
            reader = threading.Thread(target=lambda: said.extend(owner.progress_events("tables")))
            reader.start()
        if all(s == "ready" for s, _ in points.values()):
            break
        assert "failed" not in {s for s, _ in points.values()}, points
        time.sleep(0.3)
    else:
        raise AssertionError(f"the starting points were not ready within 900 s: {seen}")
    print(f"\nthe admin page showed: {seen}")
    ready = ("ready", "Ready: a new project from it starts from cached layers.")
    assert seen["data-science"][-1] == seen["pytorch"][-1] == ready, seen
    assert ("waiting", "Waiting: in line, after the starting points above.") in seen["pytorch"]
    building = [w for s, w in seen["data-science"] if s == "building"]
    assert any(re.fullmatch(r"Building: step \d+ of \d+ \(.+\)\.", w) for w in building), seen
    assert "start" in started, "the Data science starting point was never seen building"
    # the background build ran the starting point's pip, not found it in a cache
    ran = run_steps((prehub.home / "hub" / "starting-points" / "data-science.log").read_text())
    assert ran and not any(cached for _, cached in ran), ran

    owner.wait_ready("tables", timeout=600)
    reader.join(timeout=60)
    messages = [e["message"] for e in said]
    waited = [m for m in messages if m.startswith("Waiting for the Data science starting point")]
    assert waited, messages
    where = r"which this hub is preparing for every new project: step \d+ of \d+"
    assert any(re.search(where, m) for m in waited), waited
    # then its own build took every step of the starting point from what was built
    steps = run_steps(build_log(owner, "tables"))
    assert steps and all(cached for _, cached in steps), steps  # pip ran once, not twice


def test_a_later_pytorch_project_starts_from_the_cache_with_a_cpu_torch(prehub, admin, owner):
    assert starting_points(admin)["pytorch"][0] == "ready"
    create(owner, "nets-two", "pytorch")
    began = time.monotonic()
    r = owner.api("POST", f"/hub/api/users/{USER}/servers/nets-two", json={})
    assert r.status_code in (201, 202), r.text
    owner.wait_ready("nets-two", timeout=600)
    took = time.monotonic() - began
    print(f"\na new PyTorch project, its starting point built before: ready in {took:.1f} s")
    steps = run_steps(build_log(owner, "nets-two"))
    lines = [line for line, _ in steps]
    # the hub has no GPU: the stack's first line takes torch from the CPU index
    assert any("--index-url https://download.pytorch.org/whl/cpu" in ln for ln in lines), lines
    assert steps and all(cached for _, cached in steps), steps  # no pip step ran
    # and the background build that made those layers fetched no torch: the base image's
    # is the CPU wheel on this machine's disk (GPULAB_TORCH), which satisfies the line
    built = (prehub.home / "hub" / "starting-points" / "pytorch.log").read_text()
    assert "Requirement already satisfied: torch>=2" in built, built[-3000:]
    fetched = [ln for ln in built.splitlines() if re.search(r"Downloading|Collecting torch", ln)]
    assert not any("torch" in ln or "nvidia" in ln for ln in fetched), fetched

    out = owner.execute(
        "nets-two",
        "import importlib.metadata as md, torch, tqdm\n"
        "print(torch.__version__, torch.cuda.is_available())\n"
        "print(sorted(d.metadata['Name'] for d in md.distributions()"
        " if d.metadata['Name'].lower().startswith('nvidia')))\n",
        timeout=120,
    )
    first, nvidia = out.strip().splitlines()
    version, cuda = first.split()
    assert version.endswith("+cpu") and cuda == "False", out
    assert nvidia == "[]", out  # no CUDA libraries were pulled


def test_after_a_restart_the_starting_points_are_ready_at_once(prehub):
    """Re-runnable and idempotent: the next `gpulab up` looks again, finds each image by
    its content, and builds nothing (no build log is written again)."""
    logs = prehub.home / "hub" / "starting-points"
    written = {p.name: p.stat().st_mtime_ns for p in logs.iterdir()}
    assert sorted(written) == ["data-science.log", "pytorch.log"], written
    down = prehub.gpulab("down")
    assert down.returncode == 0, down.stderr
    up = prehub.gpulab("up")
    assert up.returncode == 0, up.stdout + up.stderr
    admin = log_in_admin(prehub)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        points = starting_points(admin)
        if all(s == "ready" for s, _ in points.values()):
            break
        time.sleep(0.3)
    else:
        raise AssertionError(f"not ready within 60 s of the restart: {points}")
    assert list(points) == ["data-science", "pytorch"], points
    assert {p.name: p.stat().st_mtime_ns for p in logs.iterdir()} == written
