"""`gpulab build` and `gpulab images`: a project's image, and the project image store."""

from __future__ import annotations

import os
import time
from pathlib import Path

from gpulab_hub import host, hubsettings, images
from gpulab_hub.images import project as projectimage
from gpulab_hub.projects import Project, ProjectError, project_name


def _projects(root: Path, state: Path) -> list[Project]:
    """Every project folder: ``<root>/<user>/<project>`` (folders, not links)."""
    out = []
    for user in sorted(root.iterdir()) if root.is_dir() else []:
        if user.name.startswith(".") or not user.is_dir() or user.is_symlink():
            continue
        with os.scandir(user) as it:
            names = sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
        out += [Project(root, user.name, name, state) for name in names]
    return out


def cmd_build(args, environ) -> int:
    where = hubsettings.load(hubsettings.config_file())
    root = where.projects_root
    user, _, name = args.project.partition("/")
    if not user or not name:
        raise host.HostError("name the project as USER/PROJECT, e.g. alice/vision")
    try:
        project = Project(root, user, project_name(name), where.state_root)
    except ProjectError as e:
        raise host.HostError(str(e)) from e
    if not os.path.lexists(project.dockerfile):
        raise host.HostError(f"{args.project} has no Dockerfile at {project.dockerfile}")
    dk = host.Docker()
    network = where.network
    try:
        host.ensure_network(dk, network)
        tag = projectimage.ensure_image(
            dk.call,
            project,
            root / ".locks",
            print,
            args.timeout,
            repo=where.image_repo,
            network=network,
            allowed=where.allowed_base_images,
        )
    except (images.BuildError, ProjectError) as e:
        raise host.HostError(str(e)) from e
    print(f"{args.project}: {tag}")
    return 0


def _current_tag(
    dk: host.Docker, project: Project, repo: str, allowed: tuple[str, ...]
) -> str | None:
    try:
        with projectimage.checked_context(dk.call, project, allowed) as ctx:
            return projectimage.project_tag(dk.call, ctx, repo)
    except (OSError, ProjectError):
        return None  # no Dockerfile, or one gpulab refuses: no current image


def keep_tags(
    dk: host.Docker, root: Path, state: Path, repo: str, allowed: tuple[str, ...]
) -> dict[str, list[str]]:
    """Tags in use: each project's current and last good image, and running containers."""
    keep: dict[str, list[str]] = {}
    for p in _projects(root, state):
        who = f"{p.owner}/{p.name}"
        current = _current_tag(dk, p, repo, allowed)
        if current:
            keep.setdefault(current, []).append(f"{who} (current)")
        good = projectimage.last_good(p, repo=repo)
        if good:
            keep.setdefault(good.tag, []).append(f"{who} (last good)")
    for c in dk.call("containers", filters={"ancestor": repo}):
        keep.setdefault(c["Image"], []).append(f"container {c['Names'][0].lstrip('/')}")
    return keep


def cmd_images(args, environ) -> int:
    where = hubsettings.load(hubsettings.config_file())
    repo = where.image_repo
    dk = host.Docker()
    keep = keep_tags(dk, where.projects_root, where.state_root, repo, where.allowed_base_images)
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
