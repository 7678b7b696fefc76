"""End to end: a real hub (`gpulab up`), real users, real project containers."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from conftest import PREFIX, REPO, hub_env
from hubclient import HubUser

from gpulab_hub import images

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("show_logs_on_failure")]


def make_user(hub, admin: HubUser, name: str) -> HubUser:
    user = HubUser(hub.url, name, f"{name}-Passw0rd-long")
    assert user.signup().status_code == 200
    # Before approval the login is refused, with a message saying why.
    refused = user.login()
    assert refused.status_code == 403
    assert "approved by an administrator" in refused.text
    assert admin.authorize(name).status_code == 200
    assert user.login().status_code == 302
    user.new_token()
    return user


@pytest.fixture(scope="module")
def admin(hub):
    a = HubUser(hub.url, "admin", hub.admin_password)
    r = a.login()
    assert r.status_code == 302, r.text
    a.new_token()
    return a


@pytest.fixture(scope="module")
def alice(hub, admin):
    return make_user(hub, admin, "alice")


@pytest.fixture(scope="module")
def bob(hub, admin):
    return make_user(hub, admin, "bob")


@pytest.fixture(scope="module")
def two_projects(hub, alice):
    alice.start_project("one")
    alice.start_project("two")
    yield
    for p in ("one", "two"):
        model = alice.api("GET", f"/hub/api/users/{alice.name}").json()
        if p in model["servers"]:
            alice.stop_project(p)


def test_first_start_prints_url_and_admin_password_once(hub):
    assert f"gpulab is running: open {hub.url}/" in hub.up_output
    assert "Log in as 'admin' with the password" in hub.up_output
    # ...and how to reach a project over SSH (the gateway started with the hub).
    port = hub.env["GPULAB_SSH_PORT"]
    assert f"SSH into a project: ssh -p {port} <you>+<project>@127.0.0.1 " in hub.up_output
    # Printed once: the file it came from is gone, and a second `up` does not show it.
    assert not (hub.home / "hub" / "first-admin-password").exists()
    again = hub.gpulab("up")
    assert again.returncode == 0
    assert "already running" in again.stdout
    assert hub.admin_password not in again.stdout


def test_login_page_refuses_a_wrong_password(hub):
    r = HubUser(hub.url, "admin", "not-the-password").login()
    assert r.status_code == 403
    assert "Invalid username or password" in r.text


def test_each_project_has_its_own_container_and_workspace(hub, alice, two_projects):
    root = hub.home / "projects" / "alice"
    assert (root / "one" / "Dockerfile").read_text().startswith('# gpulab project "one"')

    out = alice.execute(
        "one", "import os; open('note.txt','w').write('from one'); print(os.getcwd())"
    )
    assert out.strip() == "/workspace"
    assert (root / "one" / "note.txt").read_text() == "from one"
    assert not (root / "two" / "note.txt").exists()
    out = alice.execute("two", "import os; print(sorted(os.listdir('.')))")
    assert "note.txt" not in out and "Dockerfile" in out

    # Separate Python environments: a module added in one is absent from two.
    site = "import sysconfig; p = sysconfig.get_paths()['purelib']"
    alice.execute("one", site + "; open(p + '/only_in_one.py', 'w').write('X = 1')")
    assert alice.execute("one", "import only_in_one; print(only_in_one.X)").strip() == "1"
    out = alice.execute(
        "two", "import importlib.util; print(importlib.util.find_spec('only_in_one'))"
    )
    assert out.strip() == "None"


def test_container_mounts_and_environment(hub, alice, two_projects):
    code = "\n".join(
        [
            "import os",
            "def writable(p):",
            "    try:",
            "        open(p + '/probe', 'w').close(); os.remove(p + '/probe'); return True",
            "    except OSError:",
            "        return False",
            "print(*(writable('/data/' + d) for d in ('datasets', 'models', 'outputs')))",
            "print(os.environ['HF_HOME'], writable(os.environ['HF_HOME']))",
            "st = os.statvfs('/dev/shm'); print(st.f_blocks * st.f_frsize // 2**30)",
            "print(os.environ['GPULAB_PROJECT'], os.getuid())",
        ]
    )
    lines = alice.execute("one", code).splitlines()
    assert lines[0] == "False True True"
    assert lines[1] == "/cache/huggingface True"
    assert lines[2] == "8"
    assert lines[3] == "one 1000"


def test_user_side_extension_answers_in_the_container(alice, two_projects):
    r = alice.api("GET", "/user/alice/two/api/gpulab/v1/info")
    assert r.status_code == 200, r.text
    assert r.json()["project"] == "two"
    assert r.json()["owner"] == "alice"


def test_logs_in_hidden_folders_open_in_jupyterlab(alice, two_projects):
    """%gpu_install's full log is in .gpulab/logs/: JupyterLab can open it (a path the
    magic prints, File > Open from Path) instead of a 404 for a hidden file."""
    alice.execute(
        "two",
        "import os; os.makedirs('.gpulab/logs', exist_ok=True); "
        "open('.gpulab/logs/gpu_install-x.log', 'w').write('the whole log')",
    )
    r = alice.api("GET", "/user/alice/two/api/contents/.gpulab/logs/gpu_install-x.log")
    assert r.status_code == 200 and r.json()["content"] == "the whole log", r.text


def test_another_user_is_refused(alice, bob, two_projects):
    # bob's token on alice's server, through the proxy
    r = bob.api("GET", "/user/alice/one/api/contents", allow_redirects=False)
    assert r.status_code == 403
    # bob's browser session on alice's server
    r = bob.http.get(f"{alice.server_url('one')}/api/contents", allow_redirects=True)
    assert r.status_code == 403
    # bob cannot start, stop or list alice's projects (JupyterHub answers 404
    # rather than 403 on the API, so as not to reveal that alice exists)
    refused = (403, 404)
    assert bob.api("POST", "/hub/api/users/alice/servers/three", json={}).status_code in refused
    assert bob.api("DELETE", "/hub/api/users/alice/servers/one").status_code in refused
    assert bob.api("GET", "/hub/api/users/alice").status_code in refused
    assert "three" not in alice.api("GET", "/hub/api/users/alice").json()["servers"]


def test_status_lists_running_projects(hub, two_projects):
    out = hub.gpulab("status").stdout
    assert "hub: running" in out
    assert "alice/one: Up" in out and "alice/two: Up" in out


def test_invalid_project_name_is_refused(alice):
    r = alice.api("POST", "/hub/api/users/alice/servers/Bad_Name", json={})
    assert r.status_code == 400
    assert "Invalid server_name" in r.json()["message"]


def test_no_default_project_through_the_api(hub, alice):
    """The default server, and a project named like it, are refused with a reason:
    no hidden project that sharing does not list."""
    for path in ("server", "servers/default"):
        r = alice.api("POST", f"/hub/api/users/alice/{path}", json={})
        if r.status_code < 400:  # a failure after the first second: on the progress stream
            events = alice.api("GET", f"/hub/api/users/alice/{path}/progress").text
            assert "no default project" in events, events
        else:
            assert "no default project" in r.json()["message"], r.text
    assert not (hub.home / "projects" / "alice" / "default").exists()


def spawn_failure(user: HubUser, project: str, options: dict | None = None) -> dict:
    """Start a project that must fail; return what the user is told.

    A spawn that fails at once answers the start request itself; a slower one
    fails on the progress stream the spawn page shows.
    """
    r = user.api("POST", f"/hub/api/users/{user.name}/servers/{project}", json=options or {})
    if r.status_code >= 400:
        message = r.json()["message"]
        return {"message": message, "html_message": message, "events": []}
    events = user.progress_events(project)
    assert events and events[-1].get("failed"), events
    final = events[-1]
    return {
        "message": final["message"],
        "html_message": final.get("html_message", final["message"]),
        "events": events,
    }


def test_failing_dockerfile_shows_build_log_and_keeps_the_file(hub, alice):
    project = hub.home / "projects" / "alice" / "broken"
    project.mkdir(parents=True)
    dockerfile = (
        f"FROM {PREFIX}/base:latest\n"
        "RUN echo preparing-the-step\n"
        "RUN echo the-compiler-said-no && exit 3\n"
    )
    (project / "Dockerfile").write_text(dockerfile)

    told = spawn_failure(alice, "broken")
    assert "The Dockerfile of project broken failed to build" in told["message"]
    for text in (told["message"], told["html_message"]):
        assert "the-compiler-said-no" in text
        assert "returned a non-zero code: 3" in text
        assert "Traceback" not in text
    assert (project / "Dockerfile").read_text() == dockerfile
    assert not (project / ".gpulab").exists()  # the hub keeps its state out of the project
    logs = list((hub.home / "hub" / "projects" / "alice" / "broken" / "logs").glob("build-*.log"))
    assert logs and "the-compiler-said-no" in logs[0].read_text()


def test_broken_dockerfile_can_start_from_the_last_good_image(hub, alice):
    alice.start_project("mend")
    alice.stop_project("mend")
    dockerfile = hub.home / "projects" / "alice" / "mend" / "Dockerfile"
    broken = dockerfile.read_text() + "RUN echo about-to-fail && exit 5\n"
    dockerfile.write_text(broken)

    told = spawn_failure(alice, "mend")
    assert "failed to build" in told["message"]
    assert "The last image that built" in told["message"]

    # The spawn page now offers the last good image ...
    page = alice.http.get(f"{hub.url}/hub/spawn/alice/mend")
    assert page.status_code == 200
    assert "Start the last image that built" in page.text
    # ... which starts, so the user can fix the Dockerfile from inside.
    r = alice.api("POST", "/hub/api/users/alice/servers/mend", json={"use_last_good": True})
    assert r.status_code in (201, 202), r.text
    alice.wait_ready("mend")
    out = alice.execute("mend", "print(open('Dockerfile').read().splitlines()[-1])")
    assert out.strip() == "RUN echo about-to-fail && exit 5"
    alice.execute(
        "mend",
        "t = open('Dockerfile').read(); open('Dockerfile', 'w').write(t.replace('exit 5', 'true'))",
    )
    alice.stop_project("mend")
    assert dockerfile.read_text() == broken.replace("exit 5", "true")
    # fixed: a plain start builds it again
    alice.start_project("mend")
    alice.stop_project("mend")


def test_unknown_spawn_options_are_refused(alice):
    told = spawn_failure(alice, "odd", {"image": "evil/image"})
    assert "Unknown spawn option 'image'" in told["message"]


def test_build_progress_is_shown_while_spawning(hub, alice):
    project = hub.home / "projects" / "alice" / "slow"
    project.mkdir(parents=True)
    (project / "Dockerfile").write_text(
        f"FROM {PREFIX}/base:latest\nRUN sleep 11 && echo slow-step-done\n"
    )
    r = alice.api("POST", "/hub/api/users/alice/servers/slow", json={})
    assert r.status_code == 202, r.text  # still building after JupyterHub's 10 s
    events = alice.progress_events("slow")
    messages = [e["message"] for e in events]
    step = "Building image: Step 2/"
    assert any(m.startswith(step) and "RUN sleep 11" in m for m in messages), messages
    assert events[-1].get("ready"), events[-1]
    alice.stop_project("slow")


def test_project_folder_that_cannot_be_created(hub, alice):
    (hub.home / "projects" / "alice" / "blocked").write_text("a file in the way")
    told = spawn_failure(alice, "blocked")
    assert "Cannot create the project directory" in told["message"]
    assert (hub.home / "projects" / "alice" / "blocked").read_text() == "a file in the way"


def test_stopping_keeps_the_project_files(hub, alice, docker_engine):
    alice.start_project("keep")
    alice.execute("keep", "open('work.txt', 'w').write('kept')")
    alice.stop_project("keep")
    assert not docker_engine.call("containers", all=True, filters={"name": f"{PREFIX}-alice--keep"})
    assert (hub.home / "projects" / "alice" / "keep" / "work.txt").read_text() == "kept"
    # Restarting reuses the image (same Dockerfile) and finds the file.
    alice.start_project("keep")
    assert alice.execute("keep", "print(open('work.txt').read())").strip() == "kept"
    alice.stop_project("keep")


def test_docker_engine_unreachable_is_explained(docker_engine, tmp_path):
    """A hub whose Docker engine does not answer tells the user so on spawn."""
    env = hub_env(tmp_path, DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock")
    env["GPULAB_ADMIN_PASSWORD"] = "an-admin-password-1"
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    (tmp_path / "hub").mkdir()
    log = open(tmp_path / "hub" / "hub.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterhub", "-f", str(REPO / "jupyterhub_config.py")],
        cwd=tmp_path / "hub",
        env=env,
        stdout=log,
        stderr=log,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(env["GPULAB_BIND_URL"] + "/hub/api/", timeout=2).ok:
                    break
            except requests.RequestException:
                time.sleep(0.3)
        admin = HubUser(env["GPULAB_BIND_URL"], "admin", "an-admin-password-1")
        assert admin.login().status_code == 302
        admin.new_token()
        told = spawn_failure(admin, "lab")
        assert "The Docker engine is not reachable" in told["message"]
        assert "Traceback" not in told["message"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_gpulab_build_and_images(hub, alice, two_projects, docker_engine):
    built = hub.gpulab("build", "alice/one")
    assert built.returncode == 0, built.stderr
    assert "Using the image" in built.stdout and "alice/one: " in built.stdout
    tag = built.stdout.strip().splitlines()[-1].split(": ")[1]

    docker_engine.call("tag", tag, f"{PREFIX}/project", "stray")
    listed = hub.gpulab("images")
    assert "alice/one (current)" in listed.stdout
    assert f"{PREFIX}/project:stray" in listed.stdout
    pruned = hub.gpulab("images", "--prune")
    assert pruned.returncode == 0, pruned.stderr
    assert not images.image_id(docker_engine.call, f"{PREFIX}/project:stray")
    assert images.image_id(docker_engine.call, tag)  # in use: kept

    refused = hub.gpulab("build", "alice/Not-A-Name")
    assert refused.returncode == 1 and "Invalid project name" in refused.stderr


def test_gpu_request_on_a_host_without_gpus_is_refused(alice):
    told = spawn_failure(alice, "wants-gpu", {"gpus": 1})
    assert "asks for 1 GPU(s), but no NVIDIA driver on this host" in told["message"]
    # the same project without GPUs starts (CPU projects work on GPU-less hubs)
    r = alice.api("POST", "/hub/api/users/alice/servers/wants-gpu", json={"gpus": 0})
    assert r.status_code in (201, 202), r.text
    alice.wait_ready("wants-gpu")
    out = alice.execute(
        "wants-gpu",
        "import os; print(os.environ['NVIDIA_VISIBLE_DEVICES'], os.path.exists('/dev/nvidiactl'))",
    )
    assert out.split() == ["void", "False"]
    alice.stop_project("wants-gpu")
