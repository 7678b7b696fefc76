"""A project user attacks the hub through their project folder, from their own container.

Each attack is made as the attacker makes it: by Python run in the user's own
running project (as the notebook user, in /workspace), then a restart through
the hub's API. The hub runs as root on the host and must not follow what was
planted: the host targets stay as they were and nothing of them is shown.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest
from conftest import PREFIX
from hubclient import HubUser
from people import log_in_admin, make_user

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("show_logs_on_failure")]

SECRET_LINES = ["fs-secret-first-line", "fs-secret-second-line"]


@pytest.fixture(scope="module")
def admin(hub):
    return log_in_admin(hub)


@pytest.fixture(scope="module")
def mallory(hub, admin):
    return make_user(hub, admin, "fsmallory")


@pytest.fixture(scope="module")
def victim(hub, admin):
    return make_user(hub, admin, "fsvictim")


class Targets:
    """Root-only host things the attacker points links at."""

    def __init__(self, base: Path):
        base.mkdir(mode=0o700)
        self.file = base / "secret.txt"
        self.file.write_text("\n".join(SECRET_LINES) + "\n")
        self.file.chmod(0o600)
        self.dir = base / "secret-dir"
        self.dir.mkdir(mode=0o700)
        (self.dir / "inner.txt").write_text(SECRET_LINES[0] + "\n")
        (self.dir / "inner.txt").chmod(0o600)
        self.before = self.snapshot()

    def snapshot(self):
        out = {}
        for p in (self.file, self.dir, *sorted(self.dir.iterdir())):
            s = os.lstat(p)
            out[str(p)] = (s.st_uid, s.st_gid, stat.S_IMODE(s.st_mode), s.st_mtime_ns, s.st_size)
        out["file"] = self.file.read_text()
        return out

    def unchanged(self) -> bool:
        return self.snapshot() == self.before


@pytest.fixture
def targets(tmp_path) -> Targets:
    return Targets(tmp_path / "host-targets")


def attack(user: HubUser, project: str, code: str) -> None:
    """Run ``code`` in the user's own running project, then stop it."""
    assert user.execute(project, code + "\nprint('planted')\n").strip().endswith("planted")
    user.stop_project(project)


def spawn_failure(user: HubUser, project: str, options: dict | None = None) -> dict:
    """Start a project that must fail; what the user is told (message and progress)."""
    r = user.api("POST", f"/hub/api/users/{user.name}/servers/{project}", json=options or {})
    if r.status_code >= 400:
        return {"message": r.json()["message"], "events": []}
    events = user.progress_events(project)
    assert events and events[-1].get("failed"), events
    return {"message": events[-1]["message"], "events": events}


def shows_nothing_of_the_secret(told: dict) -> None:
    text = json.dumps(told)
    for line in SECRET_LINES:
        assert line not in text


def project_images(docker_engine) -> set[str]:
    return {i["Id"] for i in docker_engine.call("images", name=f"{PREFIX}/project")}


def container_image(docker_engine, user: str, project: str) -> str:
    info = docker_engine.call("inspect_container", f"{PREFIX}-{user}--{project}")
    return info["Config"]["Image"]


def test_dockerfile_replaced_by_a_link_to_a_root_only_file(hub, mallory, targets):
    mallory.start_project("fsa")
    attack(
        mallory,
        "fsa",
        f"import os\nos.remove('Dockerfile')\nos.symlink({str(targets.file)!r}, 'Dockerfile')",
    )
    told = spawn_failure(mallory, "fsa")
    assert (
        "The project's Dockerfile is a link; gpulab builds only a regular file" in (told["message"])
    )
    assert "Traceback" not in told["message"]
    shows_nothing_of_the_secret(told)
    assert targets.unchanged()
    folder = hub.home / "projects" / mallory.name / "fsa"
    assert os.readlink(folder / "Dockerfile") == str(targets.file)  # left as the user made it


def test_copy_of_a_link_to_a_root_only_folder(hub, mallory, targets, docker_engine):
    mallory.start_project("fsb")
    before = project_images(docker_engine)
    attack(
        mallory,
        "fsb",
        f"import os\nos.symlink({str(targets.dir)!r}, 'secretlink')\n"
        "open('Dockerfile', 'a').write('COPY secretlink /x\\n')",
    )
    told = spawn_failure(mallory, "fsb")
    assert "The project's secretlink is a link; gpulab does not follow links" in told["message"]
    assert not any("Building image" in e.get("message", "") for e in told["events"])
    shows_nothing_of_the_secret(told)
    assert project_images(docker_engine) == before  # no image was built, none holds it
    assert targets.unchanged()


def test_planted_image_record_does_not_choose_the_image(hub, mallory, victim, docker_engine):
    victim.start_project("fsv")
    theirs = container_image(docker_engine, victim.name, "fsv")
    victim_tag = next(
        t
        for t in docker_engine.call("inspect_image", theirs)["RepoTags"]
        if t.startswith(f"{PREFIX}/project:")
    )
    mallory.start_project("fsc")
    mine = container_image(docker_engine, mallory.name, "fsc")
    assert mine != victim_tag
    record = {"last_good": {"tag": victim_tag, "built_at": time.time()}, "failed": True}
    attack(
        mallory,
        "fsc",
        "import json, os\nos.makedirs('.gpulab', exist_ok=True)\n"
        f"open('.gpulab/image.json', 'w').write(json.dumps({record!r}))\n"
        "open('Dockerfile', 'a').write('RUN exit 9\\n')",
    )
    told = spawn_failure(mallory, "fsc")
    assert "failed to build" in told["message"]
    assert "build log" in told["message"] and str(hub.home) not in told["message"]
    page = mallory.http.get(f"{hub.url}/hub/spawn/{mallory.name}/fsc")
    assert victim_tag not in page.text
    # "use the last good image": the hub's own record (mallory's image), never the planted one
    r = mallory.api(
        "POST", f"/hub/api/users/{mallory.name}/servers/fsc", json={"use_last_good": True}
    )
    assert r.status_code in (201, 202), r.text
    mallory.wait_ready("fsc")
    assert container_image(docker_engine, mallory.name, "fsc") == mine != victim_tag
    mallory.stop_project("fsc")

    # A project that never built (written as the container would write its folder):
    # the planted record offers nothing at all.
    folder = hub.home / "projects" / mallory.name / "fsc2"
    (folder / ".gpulab").mkdir(parents=True)
    (folder / "Dockerfile").write_text(f"FROM {PREFIX}/base:latest\nRUN exit 9\n")
    (folder / ".gpulab" / "image.json").write_text(json.dumps(record))
    told = spawn_failure(mallory, "fsc2", {"use_last_good": True})
    assert "This project has no earlier image that built." in told["message"]


def test_links_planted_where_the_hub_once_wrote(hub, mallory, targets, docker_engine):
    folder = hub.home / "projects" / mallory.name / "fsd"
    state = hub.home / "hub" / "projects" / mallory.name / "fsd"
    mallory.start_project("fsd")
    # Round 1: .gpulab and the Dockerfile's old temporary name are links; no Dockerfile.
    attack(
        mallory,
        "fsd",
        "import os\n"
        f"os.symlink({str(targets.dir)!r}, '.gpulab')\n"
        f"os.symlink({str(targets.file)!r}, '.Dockerfile.tmp')\n"
        "os.remove('Dockerfile')",
    )
    mallory.start_project("fsd")
    out = mallory.execute(
        "fsd",
        "import os, stat\ns = os.lstat('Dockerfile')\n"
        "print(stat.S_ISREG(s.st_mode), s.st_uid, os.path.islink('.gpulab'))",
    )
    assert out.split() == ["True", "1000", "True"]
    assert targets.unchanged()
    # Round 2: a real .gpulab whose logs folder is a link; the Dockerfile changes (a build).
    attack(
        mallory,
        "fsd",
        "import os\nos.remove('.gpulab')\nos.mkdir('.gpulab')\n"
        f"os.symlink({str(targets.dir)!r}, '.gpulab/logs')\n"
        "open('Dockerfile', 'a').write('RUN echo planted-round-two\\n')",
    )
    mallory.start_project("fsd")
    mallory.stop_project("fsd")
    assert targets.unchanged()
    assert os.path.islink(folder / ".gpulab" / "logs")
    assert os.path.islink(folder / ".Dockerfile.tmp")
    logs = list((state / "logs").glob("build-*.log"))
    assert any("planted-round-two" in p.read_text() for p in logs)
    for path in (state, state / "logs"):
        s = os.stat(path)
        assert (s.st_uid, stat.S_IMODE(s.st_mode)) == (0, 0o700)
