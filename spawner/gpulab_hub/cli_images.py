"""`gpulab build` and `gpulab images`: a project's image, and the project image store."""

from __future__ import annotations

import time
from pathlib import Path

from . import host, images, projectimage, settings
from .projects import Project, ProjectError, project_name


def _projects(root: Path) -> list[Project]:
    out = []
    for dockerfile in sorted(root.glob("*/*/Dockerfile")):
        out.append(Project(root, dockerfile.parent.parent.name, dockerfile.parent.name))
    return out


def cmd_build(args, environ) -> int:
    s = settings.site(environ)
    root = settings.paths(s["GPULAB_HOME"])["projects"]
    user, _, name = args.project.partition("/")
    if not user or not name:
        raise host.HostError("name the project as USER/PROJECT, e.g. alice/vision")
    try:
        project = Project(root, user, project_name(name))
    except ProjectError as e:
        raise host.HostError(str(e)) from e
    if not project.dockerfile.exists():
        raise host.HostError(f"{args.project} has no Dockerfile at {project.dockerfile}")
    dk = host.Docker()
    try:
        tag = projectimage.ensure_image(
            dk.call, project, root / ".locks", print, args.timeout, repo=s["GPULAB_IMAGE_REPO"]
        )
    except (images.BuildError, ProjectError) as e:
        raise host.HostError(str(e)) from e
    print(f"{args.project}: {tag}")
    return 0


def keep_tags(dk: host.Docker, root: Path, repo: str) -> dict[str, list[str]]:
    """Tags in use: each project's current and last good image, and running containers."""
    keep: dict[str, list[str]] = {}
    for p in _projects(root):
        who = f"{p.owner}/{p.name}"
        try:
            files = projectimage.build_context(p, p.dockerfile.read_text())
            keep.setdefault(projectimage.project_tag(dk.call, files, repo), []).append(
                f"{who} (current)"
            )
        except (OSError, ProjectError):
            pass
        good = projectimage.last_good(p)
        if good:
            keep.setdefault(good.tag, []).append(f"{who} (last good)")
    for c in dk.call("containers", filters={"ancestor": repo}):
        keep.setdefault(c["Image"], []).append(f"container {c['Names'][0].lstrip('/')}")
    return keep


def cmd_images(args, environ) -> int:
    s = settings.site(environ)
    root = settings.paths(s["GPULAB_HOME"])["projects"]
    repo = s["GPULAB_IMAGE_REPO"]
    dk = host.Docker()
    keep = keep_tags(dk, root, repo)
    removed = 0
    for img in sorted(dk.call("images", name=repo), key=lambda i: -i["Created"]):
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(img["Created"]))
        size = img["Size"] / 2**20
        for tag in sorted(t for t in img.get("RepoTags") or [] if t.startswith(repo + ":")):
            users = ", ".join(sorted(set(keep.get(tag, [])))) or "unused"
            print(f"{tag:40} {size:8.0f} MiB  {created}  {users}")
            if args.prune and tag not in keep:
                dk.call("remove_image", tag)
                removed += 1
    if args.prune:
        print(
            f"Removed {removed} unused project image tag(s); current and last good ones are kept."
        )
    return 0


def add_parsers(sub) -> None:
    b = sub.add_parser("build", help="build a project's image now (USER/PROJECT)")
    b.add_argument("project", help="USER/PROJECT")
    b.add_argument("--timeout", type=float, default=3600, help="seconds (default 3600)")
    b.set_defaults(fn=cmd_build)
    i = sub.add_parser("images", help="list project images and who uses them")
    i.add_argument("--prune", action="store_true", help="remove images no project uses")
    i.set_defaults(fn=cmd_images)
