"""Project image builds against a real Docker engine (local Debian base)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from conftest import PREFIX

from gpulab_hub import host, images
from gpulab_hub.images import project as projectimage
from gpulab_hub.projects import Project, ProjectError

pytestmark = pytest.mark.docker
REPO = f"{PREFIX}/project"
NETWORK = f"{PREFIX}-net"
MANAGED_END = "# <<< gpulab managed block <<<"


def make_project(root: Path, name: str, dockerfile: str) -> Project:
    p = Project(root, "alice", name, root / "state")
    p.path.mkdir(parents=True)
    p.dockerfile.write_text(dockerfile)
    return p


def dockerfile(base: str, managed: list[str]) -> str:
    lines = [
        f"FROM {base}",
        "RUN echo user-line-before > /before.txt",
        "# >>> gpulab managed block: written by %gpu_install, do not edit by hand >>>",
        *managed,
        MANAGED_END,
        "",
    ]
    return "\n".join(lines)


def build(dk, project: Project, lines: list[str], timeout: float = 600) -> str:
    host.ensure_network(dk, NETWORK)
    return projectimage.ensure_image(
        dk.call,
        project,
        project.root / ".locks",
        lines.append,
        timeout,
        repo=REPO,
        network=NETWORK,
        allowed=(f"{PREFIX}/debian:bookworm",),
    )


def test_unchanged_content_is_built_once(docker_engine, local_debian, tmp_path):
    p = make_project(tmp_path, "once", dockerfile(local_debian, ["RUN echo one > /one.txt"]))
    first: list[str] = []
    tag = build(docker_engine, p, first)
    assert any(line.startswith("Successfully built") for line in first)
    images_before = {i["Id"] for i in docker_engine.call("images", all=True)}

    (p.path / "notes.ipynb").write_text("{}")  # a notebook edit is not a Dockerfile change
    second: list[str] = []
    assert build(docker_engine, p, second) == tag
    assert second == [f"Using the image {tag} (the Dockerfile is unchanged)"]
    assert {i["Id"] for i in docker_engine.call("images", all=True)} == images_before
    assert projectimage.last_good(p, docker_engine.call, REPO).tag == tag


def test_one_new_managed_line_rebuilds_only_that_layer(docker_engine, local_debian, tmp_path):
    managed = ["RUN echo first > /first.txt", "RUN echo second > /second.txt"]
    p = make_project(tmp_path, "layers", dockerfile(local_debian, managed))
    build(docker_engine, p, [])
    p.dockerfile.write_text(dockerfile(local_debian, managed + ["RUN echo third > /third.txt"]))
    out: list[str] = []
    build(docker_engine, p, out)
    steps = [i for i, line in enumerate(out) if line.startswith("Step ")]
    assert len(steps) == 5, out  # FROM, the user's RUN, three managed RUN lines
    for n, i in enumerate(steps[1:4], start=2):  # the earlier RUN steps: cached
        assert out[i + 1] == " ---> Using cache", (n, out)
    assert "third" in out[steps[4]]
    assert out[steps[4] + 1] != " ---> Using cache"


def test_two_builds_of_one_content_at_once_build_once(docker_engine, local_debian, tmp_path):
    text = dockerfile(local_debian, ["RUN sleep 2 && echo together > /together.txt"])
    projects = [make_project(tmp_path, f"twin{i}", text) for i in range(2)]
    outputs: list[list[str]] = [[], []]
    tags: list[str] = ["", ""]

    def run(i):
        tags[i] = build(docker_engine, projects[i], outputs[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert tags[0] == tags[1] != ""
    built = [o for o in outputs if any(line.startswith("Successfully built") for line in o)]
    assert len(built) == 1, outputs
    assert [o for o in outputs if o not in built] == [
        [f"Using the image {tags[0]} (the Dockerfile is unchanged)"]
    ]


def test_failed_build_keeps_the_last_good_image(docker_engine, local_debian, tmp_path):
    p = make_project(tmp_path, "fallback", dockerfile(local_debian, ["RUN echo ok > /ok.txt"]))
    good = build(docker_engine, p, [])
    broken = dockerfile(local_debian, ["RUN echo ok > /ok.txt", "RUN exit 7"])
    p.dockerfile.write_text(broken)
    with pytest.raises(images.BuildError) as err:
        build(docker_engine, p, [])
    assert "returned a non-zero code: 7" in str(err.value)
    assert p.dockerfile.read_text() == broken
    assert projectimage.last_build_failed(p)
    assert projectimage.last_good(p, docker_engine.call, REPO).tag == good
    assert images.image_id(docker_engine.call, good)
    # The failed build's log is the latest, as its owner reads it; the note says when.
    text, cut = projectimage.read_log(projectimage.latest_log(p))
    assert "returned a non-zero code: 7" in text and not cut
    assert projectimage.failed_at(p) is not None
    note = projectimage.last_good_note(p, projectimage.last_good(p, repo=REPO))
    assert note.startswith(f"Running the last image that built ({good}, built ")
    assert "the Dockerfile's build of " in note and note.endswith(" failed.")


def test_build_log_is_read_bounded_and_as_plain_text(tmp_path):
    p = Project(tmp_path, "alice", "logs", tmp_path / "state")
    assert projectimage.latest_log(p) is None
    logs = projectimage.logs_dir(p)
    (logs / "build-20260101-000000.log").write_text("older\n")
    (logs / "notes.txt").write_text("not a build log\n")
    newest = logs / "build-20260102-000000.log"
    newest.write_text("x" * 100 + "\n\x1b[31mred\x1b[0m step\r\n\x1b]0;title\x07bell\x00 done\n")
    assert projectimage.latest_log(p) == newest
    text, cut = projectimage.read_log(newest, limit=40)
    assert cut and text == "red step\nbell done\n"  # from the first whole line
    (logs / "build-20260103-000000.log").symlink_to(newest)
    with pytest.raises(OSError):  # never through a link
        projectimage.read_log(projectimage.latest_log(p))


def test_a_silent_step_is_stopped_by_the_timeout(docker_engine, local_debian, tmp_path):
    p = make_project(tmp_path, "slow", dockerfile(local_debian, ["RUN sleep 30"]))
    started = time.monotonic()
    # The step is silent and slow: whichever limit notices first (3 s without output, or
    # 3 s in all) stops it, and says which.
    stopped = r"(took longer than|printed nothing for) 3 s and was stopped"
    with pytest.raises(images.BuildError, match=stopped):
        build(docker_engine, p, [], timeout=3)
    assert time.monotonic() - started < 15  # stopped at its limit, not after the step's 30 s


def test_context_holds_exactly_the_copied_files(tmp_path):
    p = make_project(
        tmp_path,
        "ctx",
        "FROM base\nCOPY requirements.txt /tmp/\nCOPY --chown=1000:100 src/ /opt/src/\n"
        "COPY --from=builder /x /x\nADD https://example.org/f.tgz /f\n",
    )
    (p.path / "requirements.txt").write_text("six==1.16.0\n")
    (p.path / "src" / "pkg").mkdir(parents=True)
    (p.path / "src" / "pkg" / "mod.py").write_text("X = 1\n")
    (p.path / "notebook.ipynb").write_text("{}")
    with projectimage.build_context(p) as ctx:
        assert ctx.names == ["Dockerfile", "requirements.txt", "src/pkg/mod.py"]


def test_copy_from_outside_the_project_is_refused(tmp_path):
    p = make_project(tmp_path, "escape", "FROM base\nCOPY ../../secrets /x\n")
    with pytest.raises(ProjectError, match="outside the project folder"):
        projectimage.build_context(p)


def test_the_start_form_ticks_building_again_once_the_dockerfile_changed(
    docker_engine, local_debian, tmp_path
):
    """The form the owner meets after a failed build: the last image that built is
    ticked while the Dockerfile is what failed; once they fixed it (from inside that
    image, say), building it again is ticked, so Start starts the fix."""
    from test_spawn_form import Radios

    from gpulab_hub.projects import options

    allowed = (f"{PREFIX}/debian:bookworm",)

    def ticked() -> list[str]:
        good = projectimage.last_good(p, docker_engine.call, REPO)
        changed = projectimage.changed_since_failure(docker_engine.call, p, REPO, allowed=allowed)
        html = options.form(good.describe(), projectimage.last_build_failed(p), None, changed)
        form = Radios(html)
        return [r["value"] for r in form.radios if r["checked"]] + [form.radios[0]["value"]]

    p = make_project(tmp_path, "mended", dockerfile(local_debian, ["RUN echo ok > /ok.txt"]))
    build(docker_engine, p, [])
    broken = dockerfile(local_debian, ["RUN echo ok > /ok.txt", "RUN exit 7"])
    p.dockerfile.write_text(broken)
    with pytest.raises(images.BuildError):
        build(docker_engine, p, [])
    assert ticked() == ["last-good", "last-good"]  # ticked, and the first choice
    # a notebook saved meanwhile is no change to the build
    (p.path / "notes.ipynb").write_text("{}")
    assert ticked() == ["last-good", "last-good"]
    fixed = dockerfile(local_debian, ["RUN echo ok > /ok.txt", "RUN echo fixed > /fixed.txt"])
    p.dockerfile.write_text(fixed)
    assert ticked() == ["rebuild", "rebuild"]
    # written back as it failed: building it again would fail the same way
    p.dockerfile.write_text(broken)
    assert ticked() == ["last-good", "last-good"]
    p.dockerfile.write_text(fixed)
    build(docker_engine, p, [])
    assert not projectimage.last_build_failed(p)
    assert "failed_tag" not in projectimage.read_state(p)
