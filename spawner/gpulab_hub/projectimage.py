"""A project's image: its build context, content tag, one build at a time, and
the last image that built (kept so a broken Dockerfile never locks a user out).
"""

from __future__ import annotations

import fnmatch
import glob
import io
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import filelock
from dockerfile_parse import DockerfileParser

from . import images
from .projects import Project, ProjectError

PROJECT_REPO = "gpulab/project"
# Never part of a build context: gpulab's own bookkeeping in the project folder.
EXCLUDED = (".gpulab", ".gpulab/*", ".ipynb_checkpoints", "*/.ipynb_checkpoints")


def _copy_sources(instruction: dict) -> list[str]:
    """Source paths of a COPY/ADD instruction (none for --from= copies and URLs)."""
    value = instruction["value"].strip()
    words: list[str]
    if value.startswith("["):
        words = json.loads(value)
    else:
        words = value.split()
    flags = [w for w in words if w.startswith("--")]
    if any(f.startswith("--from") for f in flags):
        return []
    args = [w for w in words if not w.startswith("--")]
    return [a for a in args[:-1] if "://" not in a]


def _excluded(rel: str) -> bool:
    return any(fnmatch.fnmatch(rel, pat) for pat in EXCLUDED)


def build_context(project: Project, dockerfile_text: str) -> dict[str, bytes]:
    """The Dockerfile plus exactly the project files its COPY/ADD lines use.

    Notebooks the Dockerfile does not copy are not part of the context, so
    editing them never triggers a rebuild. Raises ProjectError for a source
    outside the project folder.
    """
    root = project.path.resolve()
    files = {"Dockerfile": dockerfile_text.encode()}
    parser = DockerfileParser(fileobj=io.BytesIO(dockerfile_text.encode()))
    for ins in parser.structure:
        if ins["instruction"] not in ("COPY", "ADD"):
            continue
        for src in _copy_sources(ins):
            pattern = os.path.normpath(os.path.join(root, src))
            if not (pattern == str(root) or pattern.startswith(str(root) + os.sep)):
                raise ProjectError(
                    f"Line {ins['startline'] + 1} of the Dockerfile copies {src!r}, which is "
                    "outside the project folder; only files of the project can be copied."
                )
            for match in sorted(glob.glob(pattern)):
                path = Path(match)
                candidates = [path] if path.is_file() else sorted(path.rglob("*"))
                for f in candidates:
                    rel = f.relative_to(root).as_posix()
                    if f.is_file() and not f.is_symlink() and not _excluded(rel):
                        files[rel] = f.read_bytes()
    return files


def project_tag(docker_call, files: dict[str, bytes], repo: str = PROJECT_REPO) -> str:
    """Content tag: every file of the context plus the ID of the base image."""
    base = images.base_of(files["Dockerfile"].decode())
    base_id = images.image_id(docker_call, base) if base else None
    parts = [name.encode() + b"\0" + files[name] for name in sorted(files)]
    return images.content_tag(repo, (base_id or base).encode(), *parts)


@dataclass(frozen=True)
class LastGood:
    tag: str
    built_at: float

    def describe(self) -> str:
        return f"{self.tag}, built {time.strftime('%Y-%m-%d %H:%M', time.localtime(self.built_at))}"


def _state_file(project: Project) -> Path:
    return project.path / ".gpulab" / "image.json"


def read_state(project: Project) -> dict:
    try:
        return json.loads(_state_file(project).read_text())
    except (OSError, ValueError):
        return {}


def _write_state(project: Project, state: dict) -> None:
    path = _state_file(project)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, path)


def last_good(project: Project, docker_call=None) -> LastGood | None:
    """The last image that built for this project (if it still exists)."""
    state = read_state(project).get("last_good")
    if not state:
        return None
    if docker_call is not None and not images.image_id(docker_call, state["tag"]):
        return None
    return LastGood(state["tag"], state["built_at"])


def last_build_failed(project: Project) -> bool:
    return bool(read_state(project).get("failed"))


def record(project: Project, tag: str | None, failed: bool) -> None:
    state = read_state(project)
    state["failed"] = failed
    if tag:
        state["last_good"] = {"tag": tag, "built_at": time.time()}
    _write_state(project, state)


def ensure_image(
    docker_call,
    project: Project,
    lock_dir: Path,
    on_line,
    timeout: float,
    repo: str = PROJECT_REPO,
    labels: dict[str, str] | None = None,
) -> str:
    """The tag of the project's image, built only if its content is new.

    One build per content tag at a time, across threads and processes: a
    second caller waits for the first and then reuses its image. Records the
    result (last good image, or that the build failed) in the project.
    """
    files = build_context(project, project.dockerfile.read_text())
    tag = project_tag(docker_call, files, repo)
    lock_dir.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(lock_dir / (tag.replace("/", "_").replace(":", "_") + ".lock")))
    with lock:
        if images.image_id(docker_call, tag):
            on_line(f"Using the image {tag} (the Dockerfile is unchanged)")
        else:
            log_path = project.logs_dir / f"build-{time.strftime('%Y%m%d-%H%M%S')}.log"
            try:
                images.build(
                    docker_call, images.tar_context(files), tag, log_path, on_line, timeout, labels
                )
            except images.BuildError:
                record(project, None, failed=True)
                raise
    record(project, tag, failed=False)
    return tag
