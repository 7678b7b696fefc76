"""The production deployment, tested: compose.yml's hub image built from this checkout
as compose builds it, started with ``docker-compose up -d`` (the hub in its container,
projects beside it on the host's engine), and walked as people use it: the admin logs
in, starts a project, runs ``%gpu_install`` in its kernel (recorded in the project's
Dockerfile, still there after a restart), and shares the project with bob, who opens
it in JupyterLab. The hub image's packaging (a module left out of its wheel) and its
trust in the host's CA certificates (pip and npm behind a TLS-intercepting proxy) are
what this run would catch first.

Harness: tests/compose_kit.py. Timings of the build, the start and the walk are printed.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
import requests
from compose_kit import Deployment, host_ca_certificates, image_ids
from hubclient import HubUser, localhost_names

from gpulab_hub import host
from gpulab_hub.db import migrate

pytestmark = [pytest.mark.docker]

ADMIN_PASSWORD = "compose-Admin-passw0rd"
PROJECT, GUEST = "deploy", "cmpbob"
PACKAGE, VERSION, MODULE = "iniconfig", "2.0.0", "iniconfig"
LINE = (
    f"RUN python -m pip install --no-cache-dir {PACKAGE}=={VERSION} && python -c 'import {MODULE}'"
)


@pytest.fixture(scope="module")
def deployment(hub, local_debian, docker_engine, tmp_path_factory):
    """compose.yml built and up (after the session hub built the base image it reuses);
    ``docker-compose down`` and every object it made removed at the end."""
    dk = docker_engine
    before = image_ids(dk)
    dep = Deployment(tmp_path_factory.mktemp("compose"), ADMIN_PASSWORD)
    with localhost_names(), host_ca_certificates():
        try:
            start = time.monotonic()
            dep.must("build", "--force-rm", timeout=1200)  # a failed step leaves no container
            built = time.monotonic()
            print(f"\ncompose: hub image built in {built - start:.0f} s")
            dep.must("up", "-d", timeout=300)
            dep.wait_ready(dk)
            print(f"compose: hub up and answering in {time.monotonic() - built:.0f} s")
            yield dep
        except BaseException:
            print(f"\n----- docker-compose logs -----\n{dep.logs()}")
            raise
        finally:
            dep.remove(dk, before)
    assert dep.leftovers(dk) == [], "left behind by the compose deployment"


@pytest.fixture(autouse=True)
def compose_logs_on_failure(request, deployment):
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(f"\n----- docker-compose logs -----\n{deployment.logs()}")


def test_the_hub_runs_in_its_container_from_the_compose_image(deployment, docker_engine):
    info = docker_engine.call("inspect_container", deployment.container)
    assert info["State"]["Running"]
    assert info["Config"]["Image"] == deployment.image
    assert info["HostConfig"]["NetworkMode"] == "host"
    # The hub's login page, through its proxy, at the subdomain host compose.yml requires.
    page = requests.get(deployment.url + "/hub/login", timeout=10)
    assert page.status_code == 200 and "Sign in to gpulab" in page.text, page.text[:500]
    # The host's extra CA certificates are trusted in the image (pip and npm in its
    # build went through them), at the place `gpulab up` passes them on to projects.
    for crt in sorted(Path(host.HOST_CA_DIR).glob("*.crt")):
        inside = docker_engine.call(
            "exec_create", deployment.container, ["cat", f"{host.HOST_CA_DIR}/{crt.name}"]
        )
        assert docker_engine.call("exec_start", inside["Id"]) == crt.read_bytes(), crt.name


def open_in_lab(user: HubUser, server: str) -> requests.Response:
    """``user`` opens ``server`` (``/user/<owner>/<project>/``) in JupyterLab as a
    browser does: through the hub, on to the owner's subdomain, JupyterHub's OAuth
    (its authorize page, for a server shared with them) included."""
    s = requests.Session()
    s.cookies.update(user.http.cookies)
    r = s.get(user.base + server + "lab", timeout=30)
    if "/oauth2/authorize" in r.url:
        xsrf = s.cookies.get("_xsrf", path="/hub/")
        scopes = re.findall(r'name="scopes" value="([^"]+)"', r.text)
        r = s.post(r.url, data={"_xsrf": xsrf, "scopes": scopes}, timeout=30)
    return r


def container_id(dk, name: str) -> str:
    found = [c for c in dk.call("containers") if c["Names"][0] == "/" + name]
    assert len(found) == 1, found
    return found[0]["Id"]


def test_a_project_starts_installs_and_is_shared(deployment, docker_engine):
    walk = time.monotonic()
    admin = HubUser(deployment.url, "admin", ADMIN_PASSWORD)
    assert admin.login().status_code == 302
    admin.new_token()

    server = admin.start_project(PROJECT)
    started = time.monotonic()
    print(f"\ncompose: project {PROJECT} built and started in {started - walk:.0f} s")
    origin = "{0.scheme}://{0.netloc}".format(urlparse(server["url"]))
    assert origin == f"http://admin.{deployment.url.removeprefix('http://')}"
    # A client of the admin's own origin, with the admin's token: the kernel's channels.
    owner = HubUser(origin, "admin", "")
    owner.token = admin.token

    # The project runs beside the hub, on the host's engine.
    name = f"{deployment.container_prefix}-admin--{PROJECT}"
    first = container_id(docker_engine, name)
    dockerfile = deployment.home / "projects" / "admin" / PROJECT / "Dockerfile"
    before = dockerfile.read_text()
    find = f"import importlib.util as u; print(u.find_spec('{MODULE}'))"
    assert owner.execute(PROJECT, find).strip() == "None"
    owner.execute(PROJECT, f"%gpu_install {PACKAGE}=={VERSION}", timeout=300)
    after = dockerfile.read_text()
    assert [ln for ln in after.splitlines() if ln not in before.splitlines()] == [LINE]
    installed = time.monotonic()
    print(f"compose: %gpu_install recorded in {installed - started:.0f} s")

    admin.stop_project(PROJECT)
    admin.start_project(PROJECT)  # the new Dockerfile is built: the package is in the image
    assert container_id(docker_engine, name) != first
    out = owner.execute(
        PROJECT, f"import importlib.metadata as m; print(m.version('{PACKAGE}'))", timeout=60
    )
    assert out.strip() == VERSION
    owner.execute(PROJECT, "open('hello.txt', 'w').write('from the admin')")
    restarted = time.monotonic()
    print(f"compose: restarted with {PACKAGE} in its image in {restarted - installed:.0f} s")

    # bob signs up, the admin approves him and shares the project with him.
    bob = HubUser(deployment.url, GUEST, f"{GUEST}-Passw0rd-long")
    assert bob.signup().status_code == 200
    assert admin.authorize(GUEST).status_code == 200
    assert bob.login().status_code == 302
    path = f"/user/admin/{PROJECT}/"
    assert open_in_lab(bob, path).status_code == 404  # not shared yet: not there for him
    xsrf = admin.http.cookies.get("_xsrf", path="/hub/")
    page = admin.http.post(
        f"{deployment.url}/hub/gpulab/share/{PROJECT}",
        data={"_xsrf": xsrf, "action": "user", "name": GUEST, "role": "collaborator"},
        timeout=30,
    )
    assert page.status_code == 200, page.text
    assert f"Shared with user {GUEST} as collaborator." in page.text
    lab = open_in_lab(bob, path)
    assert lab.status_code == 200, lab.text[:500]
    assert lab.url.startswith(origin + path + "lab"), lab.url
    assert "JupyterLab" in lab.text
    bob.new_token()
    guest = HubUser(origin, "admin", "")
    guest.token = bob.token
    read = guest.api("GET", f"{path}api/contents/hello.txt")
    assert read.status_code == 200, read.text
    assert read.json()["content"] == "from the admin"
    print(f"compose: shared and opened by {GUEST} in {time.monotonic() - restarted:.0f} s")
    admin.stop_project(PROJECT)
    print(f"compose: walk done in {time.monotonic() - walk:.0f} s")


def test_the_hubs_state_is_in_postgresql_and_outlasts_a_restart(deployment, docker_engine):
    """JupyterHub's tables and gpulab's in the db service's PostgreSQL (no SQLite file
    beside the hub), which has no network; the walk's accounts and share still there
    after the hub's container restarts."""
    db = docker_engine.call("inspect_container", deployment.db_container)
    assert db["State"]["Running"] and db["HostConfig"]["NetworkMode"] == "none"
    assert not (deployment.home / "hub" / "jupyterhub.sqlite").exists()
    users = deployment.psql(docker_engine, "SELECT name FROM users ORDER BY name")
    assert {"admin", GUEST} <= set(users), users
    (version,) = deployment.psql(docker_engine, "SELECT version_num FROM gpulab_alembic_version")
    assert version == migrate.head()
    shared = deployment.psql(
        docker_engine,
        "SELECT u.name FROM shares s JOIN users u ON u.id = s.user_id "
        "JOIN spawners sp ON sp.id = s.spawner_id WHERE sp.name = 'deploy'",
    )
    assert shared == [GUEST], shared

    deployment.must("restart", "hub", timeout=300)
    deployment.wait_ready(docker_engine)
    admin = HubUser(deployment.url, "admin", ADMIN_PASSWORD)
    assert admin.login().status_code == 302  # the password hash, read back from PostgreSQL
    admin.new_token()
    listed = admin.api("GET", f"/hub/api/shares/admin/{PROJECT}")
    assert listed.status_code == 200, listed.text
    assert [s["user"]["name"] for s in listed.json()["items"] if s.get("user")] == [GUEST]
