"""The hub treats everything in a project folder as hostile input (real files, as root).

For every place the hub reads or writes in a project folder, each attack a
project user can make there: a link to a root-only file or folder outside, a
FIFO, a device file and an oversized file. Each must fail quickly with a clear
message, and the outside target must be unchanged (content, owner, mode).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import stat
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulab_hub import images
from gpulab_hub.images import project as projectimage
from gpulab_hub.projects import Project, ProjectError, safefs
from gpulab_hub.projects.safefs import ensure_project
from gpulab_hub.sharing import copy, notebooks, public

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plants device files and chowns: root")
SECRET = b"root-only secret line 1\nroot-only secret line 2\n"
UID, GID = 101000, 100100  # the notebook user as the host sees it (remapped)
ATTACKS = ["link_file", "link_dir", "fifo", "device"]


@contextlib.contextmanager
def deadline(seconds: float = 5):
    """Fail (instead of hanging) when the body blocks, e.g. on a FIFO."""

    def expired(signum, frame):
        raise TimeoutError(f"blocked for more than {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class Outside:
    """Root-only things outside every project: a file and a folder."""

    def __init__(self, base: Path):
        base.mkdir(mode=0o700)
        self.file = base / "secret.txt"
        self.file.write_bytes(SECRET)
        self.file.chmod(0o600)
        self.dir = base / "secret-dir"
        self.dir.mkdir(mode=0o700)
        (self.dir / "inner.txt").write_bytes(SECRET)
        (self.dir / "inner.txt").chmod(0o600)
        self.before = self.snapshot()

    def snapshot(self):
        out = {}
        for p in (self.file, self.dir, self.dir / "inner.txt"):
            s = os.lstat(p)
            out[p] = (s.st_uid, s.st_gid, stat.S_IMODE(s.st_mode), s.st_mtime_ns)
        out["content"] = (self.file.read_bytes(), (self.dir / "inner.txt").read_bytes())
        out["listing"] = sorted(os.listdir(self.dir))
        return out

    def unchanged(self) -> bool:
        return self.snapshot() == self.before


@pytest.fixture
def outside(tmp_path) -> Outside:
    return Outside(tmp_path / "outside")


@pytest.fixture
def project(tmp_path) -> Project:
    p = Project(tmp_path / "projects", "alice", "p", tmp_path / "state")
    assert ensure_project(p, "FROM base\n", UID, GID)
    return p


def plant(path: Path, attack: str, outside: Outside) -> None:
    """Make ``path`` what the attacker makes it (replacing what is there)."""
    if path.is_dir() and not path.is_symlink():
        os.rmdir(path)
    elif os.path.lexists(path):
        path.unlink()
    if attack == "link_file":
        path.symlink_to(outside.file)
    elif attack == "link_dir":
        path.symlink_to(outside.dir)
    elif attack == "fifo":
        os.mkfifo(path)
    elif attack == "device":  # what /dev/null is
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    else:
        raise ValueError(attack)


def big(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)  # sparse: costs no disk


def expected_words(attack: str) -> str:
    return {
        "link_file": "is a link",
        "link_dir": "is a link",
        "fifo": "is a named pipe (FIFO), not a regular file",
        "device": "is a device file, not a regular file",
    }[attack]


def refused(fn, *args, match: str, **kwargs) -> ProjectError:
    with deadline(), pytest.raises(ProjectError, match=re.escape(match)) as err:
        fn(*args, **kwargs)
    assert SECRET.decode().splitlines()[0] not in str(err.value)
    return err.value


# --- the Dockerfile -----------------------------------------------------------


@pytest.mark.parametrize("attack", ATTACKS)
def test_dockerfile_that_is_not_a_regular_file(project, outside, attack):
    plant(project.dockerfile, attack, outside)
    err = refused(projectimage.build_context, project, match=f"Dockerfile {expected_words(attack)}")
    if attack.startswith("link"):
        assert str(err) == (
            "The project's Dockerfile is a link; gpulab builds only a regular file named "
            "Dockerfile. Replace the link with the file itself."
        )
    # ensure_project on the next start neither replaces it nor changes its owner
    assert ensure_project(project, "FROM base\n", UID, GID) is False
    assert outside.unchanged()
    assert os.path.lexists(project.dockerfile)


def test_oversized_dockerfile(project):
    big(project.dockerfile, projectimage.MAX_DOCKERFILE_BYTES + 1)
    refused(projectimage.build_context, project, match="Dockerfile is larger than 1 MiB")


def test_dockerfile_that_is_not_text(project):
    project.dockerfile.write_bytes(b"FROM base\n\xff\xfe\n")
    refused(projectimage.build_context, project, match="not UTF-8 text")


# --- COPY sources ----------------------------------------------------------------


def write_dockerfile(project: Project, *lines: str) -> None:
    project.dockerfile.write_text("FROM base\n" + "".join(f"{line}\n" for line in lines))


@pytest.mark.parametrize("attack", ATTACKS)
@pytest.mark.parametrize(
    "copy_line, planted",
    [
        ("COPY secret /x", "secret"),  # the source itself
        ("COPY sec* /x/", "secret"),  # a glob that matches it
        ("COPY src /x", "src/deep/secret"),  # inside a copied folder
        ("COPY . /x", "src/deep/secret"),  # inside the whole project
        ("COPY src/*/secret /x", "src/deep/secret"),  # a glob in the middle
    ],
)
def test_copy_source_that_is_not_a_regular_file(project, outside, attack, copy_line, planted):
    (project.path / "src" / "deep").mkdir(parents=True)
    (project.path / "src" / "ok.txt").write_text("fine")
    plant(project.path / planted, attack, outside)
    write_dockerfile(project, copy_line)
    err = refused(projectimage.build_context, project, match=expected_words(attack))
    assert f"The project's {planted} " in str(err)
    assert outside.unchanged()


@pytest.mark.parametrize("copy_line", ["COPY sub/inner.txt /x", "COPY sub/* /x/", "COPY */in* /x/"])
def test_copy_through_a_linked_folder(project, outside, copy_line):
    (project.path / "sub").symlink_to(outside.dir)
    write_dockerfile(project, copy_line)
    err = refused(projectimage.build_context, project, match="The project's sub is a link")
    assert "Replace the link" in str(err)
    assert outside.unchanged()


def test_copy_source_outside_the_project(project):
    write_dockerfile(project, "COPY ../../outside/secret.txt /x")
    refused(projectimage.build_context, project, match="outside the project folder")


def test_oversized_context(project):
    big(project.path / "huge.bin", projectimage.MAX_CONTEXT_BYTES + 1)
    write_dockerfile(project, "COPY huge.bin /x")
    refused(projectimage.build_context, project, match="over 1 GiB together")


def test_context_of_too_many_files(project, monkeypatch):
    monkeypatch.setattr(projectimage, "MAX_CONTEXT_FILES", 10)
    (project.path / "many").mkdir()
    for i in range(20):
        (project.path / "many" / f"f{i}").write_text("x")
    write_dockerfile(project, "COPY many /x")
    refused(projectimage.build_context, project, match="too many files and folders")


def test_context_is_exactly_what_was_read_and_tagged_as_before(project):
    (project.path / "a").mkdir()
    (project.path / "a" / "one.py").write_text("ONE = 1\n")
    (project.path / "a" / ".ipynb_checkpoints").mkdir()
    (project.path / "a" / ".ipynb_checkpoints" / "x.ipynb").write_text("{}")
    (project.path / ".gpulab").mkdir()
    (project.path / ".gpulab" / "image.json").write_text("{}")
    (project.path / "req.txt").write_text("six\n")
    (project.path / "notebook.ipynb").write_text("{}")
    text = "COPY a /a\nCOPY req.txt Dockerfile /r/\nCOPY . /all\n"  # no FROM: no Docker
    project.dockerfile.write_text(text)
    with projectimage.build_context(project) as ctx:
        names = ctx.names
        tag = projectimage.project_tag(None, ctx, "r")
        with tarfile.open(fileobj=ctx.tarball()) as tar:
            content = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    assert names == ["Dockerfile", "a/one.py", "notebook.ipynb", "req.txt"]
    assert sorted(content) == names
    assert content["a/one.py"] == b"ONE = 1\n" and content["Dockerfile"] == text.encode()
    # the tag formula of earlier releases: unchanged projects do not rebuild
    parts = [n.encode() + b"\0" + content[n] for n in names]
    assert tag == images.content_tag("r", b"", *parts)


# --- the project folder itself, and what the hub writes there --------------------


@pytest.mark.parametrize("where", ["project", "owner"])
def test_project_folder_that_is_a_link(tmp_path, outside, where):
    p = Project(tmp_path / "projects", "alice", "p", tmp_path / "state")
    (tmp_path / "projects" / "alice").mkdir(parents=True)
    if where == "project":
        p.path.symlink_to(outside.dir)
    else:
        os.rmdir(tmp_path / "projects" / "alice")
        (tmp_path / "projects" / "alice").symlink_to(outside.dir)
    refused(ensure_project, p, "FROM base\n", UID, GID, match="Cannot create the project")
    refused(projectimage.build_context, p, match="There is no project p")
    assert outside.unchanged()


def test_new_project_is_given_to_the_notebook_user_and_holds_only_its_dockerfile(tmp_path):
    p = Project(tmp_path / "projects", "alice", "p", tmp_path / "state")
    assert ensure_project(p, "FROM base\n", UID, GID)
    owner_dir = os.stat(p.path.parent)
    assert (owner_dir.st_uid, stat.S_IMODE(owner_dir.st_mode)) == (0, 0o755)
    for path in (p.path, p.dockerfile):
        assert (os.stat(path).st_uid, os.stat(path).st_gid) == (UID, GID)
    assert os.listdir(p.path) == ["Dockerfile"]


@pytest.mark.parametrize("attack", ATTACKS)
@pytest.mark.parametrize("name", [".Dockerfile.tmp", ".gpulab", "Dockerfile"])
def test_planted_entries_are_never_written_through(project, outside, attack, name):
    """The hub writes a missing Dockerfile only exclusively; .gpulab is not the hub's."""
    project.dockerfile.unlink()
    plant(project.path / name, attack, outside)
    if name == ".gpulab" and attack == "link_dir":  # and a logs link inside a real .gpulab
        (project.path / ".gpulab").unlink()
        (project.path / ".gpulab").mkdir()
        (project.path / ".gpulab" / "logs").symlink_to(outside.dir)
    with deadline():
        created = ensure_project(project, "FROM base\n", UID, GID)
        projectimage.record(project, "gpulab/project:0123456789abcdef", failed=False)
    assert created == (name != "Dockerfile")
    if created:
        assert project.dockerfile.read_text() == "FROM base\n"
        assert os.stat(project.dockerfile).st_uid == UID
    assert outside.unchanged()
    state = os.stat(project.state_dir)
    assert (state.st_uid, stat.S_IMODE(state.st_mode)) == (0, 0o700)


# --- the hub's record of the last good image --------------------------------------


def test_record_planted_in_the_project_is_not_read(project, outside):
    planted = {"last_good": {"tag": "gpulab/project:0123456789abcdef", "built_at": 1}}
    (project.path / ".gpulab").mkdir()
    (project.path / ".gpulab" / "image.json").write_text(json.dumps(planted))
    assert projectimage.last_good(project) is None
    assert not projectimage.last_build_failed(project)


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[]",
        '{"last_good": "x"}',
        '{"last_good": {"tag": 5, "built_at": 1}}',
        '{"last_good": {"tag": "gpulab/project:0123456789abcdef", "built_at": "soon"}}',
        '{"last_good": {"tag": "gpulab/project:0123456789abcdef", "built_at": 1e400}}',
        '{"last_good": {"tag": "other/image:0123456789abcdef", "built_at": 1}}',
        '{"last_good": {"tag": "gpulab/project:../../x", "built_at": 1}}',
        b"\xff\xfe",
    ],
)
def test_corrupt_or_foreign_record_is_no_record(project, content, caplog):
    path = projectimage.state_dir(project) / "image.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert projectimage.last_good(project) is None
    assert len([r for r in caplog.records if "gpulab: ignoring" in r.getMessage()]) == 1
    projectimage.record(project, "gpulab/project:0123456789abcdef", failed=True)
    assert projectimage.last_good(project).tag == "gpulab/project:0123456789abcdef"


# --- Save a copy (source and target) and public links -----------------------------


@pytest.fixture
def shared(tmp_path, outside):
    root = tmp_path / "projects"
    p = Project(root, "alice", "one", tmp_path / "state")
    ensure_project(p, "FROM base\n", UID, GID)
    (p.path / "nb").mkdir()
    (p.path / "nb" / "ok.ipynb").write_text('{"cells": []}')
    return p


@pytest.mark.parametrize("attack", ATTACKS)
@pytest.mark.parametrize("path", ["x.ipynb", "nb/x.ipynb", "sub/x.ipynb"])
def test_notebook_to_copy_or_show_that_is_not_a_file(shared, outside, attack, path):
    target = shared.path / ("sub" if path.startswith("sub/") else path)
    if path.startswith("sub/"):
        attack = "link_dir" if attack == "link_file" else attack
    plant(target, attack, outside)
    with deadline(), pytest.raises(notebooks.FileRefused) as err:
        notebooks.read_notebook(shared.root, "alice", "one", path)
    status = {"link_file": 403, "link_dir": 403, "fifo": 400, "device": 400}[attack]
    if path.startswith("sub/") and attack in ("fifo", "device"):
        status = 404  # a FIFO where a folder should be: no such notebook
    assert err.value.status == status, str(err.value)
    assert "secret" not in str(err.value)
    assert outside.unchanged()


def test_oversized_notebook(shared):
    big(shared.path / "big.ipynb", notebooks.MAX_BYTES + 1)
    with pytest.raises(notebooks.FileRefused) as err:
        notebooks.read_notebook(shared.root, "alice", "one", "big.ipynb")
    assert err.value.status == 413 and "over 50 MiB" in str(err.value)


@pytest.mark.parametrize("attack", ATTACKS)
def test_copy_target_name_planted(shared, outside, attack):
    plant(shared.path / "ok (copy).ipynb", attack, outside)
    with deadline():
        name = copy.write_copy(shared.root, "alice", "one", "ok.ipynb", b"{}")
    assert name == "ok (copy 2).ipynb"
    made = os.stat(shared.path / name)
    assert stat.S_ISREG(made.st_mode) and (made.st_uid, made.st_gid) == (UID, GID)
    assert outside.unchanged()


def test_public_link_listing_skips_links_and_special_files(shared, outside):
    (shared.path / "linked").symlink_to(outside.dir)
    (shared.path / "nb" / "leak.ipynb").symlink_to(outside.file)
    os.mkfifo(shared.path / "nb" / "pipe.ipynb")
    os.mknod(shared.path / "nb" / "dev.ipynb", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    (shared.path / ".hidden").mkdir()
    (shared.path / ".hidden" / "h.ipynb").write_text("{}")
    with deadline():
        found = public.notebooks_in(shared.root, "alice", "one")
    assert found == ["nb/ok.ipynb"]
    assert outside.unchanged()


# --- property: what a COPY source matches stays inside and never passes a link ----

NAMES = ["a", "b", "sub", "ln", "fifo", ".gpulab", "*", "?", "[ab]", "s*", "..", "."]


def _tree(base: Path) -> Path:
    root = base / "projects"
    p = Project(root, "alice", "p")
    ensure_project(p, "FROM base\n", UID, GID)
    for d in ("sub", "sub/a", "b", ".gpulab"):
        (p.path / d).mkdir()
    for f in ("a", "sub/b", "sub/a/a", "b/a", ".gpulab/a"):
        (p.path / f).write_text(f)
    (p.path / "sub" / "ln").symlink_to(base / "outside")
    (p.path / "b" / "ln").symlink_to(p.path / "sub")  # a link inside, to inside
    os.mkfifo(p.path / "sub" / "fifo")
    (base / "outside").mkdir(exist_ok=True)
    (base / "outside" / "a").write_text("outside")
    return p.path


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(NAMES), min_size=1, max_size=4))
def test_copy_matcher_stays_inside_and_never_passes_a_link(tmp_path_factory, parts):
    base = tmp_path_factory.mktemp("tree")
    folder = _tree(base)
    src = "/".join(parts)
    fd = safefs.open_root(folder)
    try:
        with deadline():
            found = [
                (rel, what)
                for rel, what, _, _ in projectimage.matches(
                    fd, projectimage.source_parts(src, 1), "", safefs.Budget(1000, "x")
                )
            ]
    except ProjectError:
        return  # refused (outside, or a link): nothing was read
    finally:
        os.close(fd)
    for rel, what in found:
        assert what != "link"
        assert ".gpulab" not in rel.split("/")
        here = folder
        for part in [] if rel == "." else rel.split("/"):
            here = here / part
            assert not here.is_symlink(), rel
        assert os.path.realpath(here).startswith(str(folder))
