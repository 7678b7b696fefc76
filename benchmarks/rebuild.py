"""Full build vs rebuild after one appended managed-block line.

Builds gpulab's CPU base image and a project image on it from scratch (no
cache), appends one install line to the project's managed block, rebuilds
through gpulab's pipeline, and times that pip install alone in a container of
the same image. Everything it makes is named ``gpulabbench-rebuild`` and
removed at the end.

    .venv/bin/python benchmarks/rebuild.py [--package numpy==2.1.3 --module numpy]

Last line: ``rebuild_ratio=<rebuild after one appended line / that pip install alone>``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docker.errors

from gpulab_hub import host, images
from gpulab_hub.images import base as baseimage
from gpulab_hub.images import project as projectimage
from gpulab_hub.projects import Project

PREFIX = "gpulabbench-rebuild"
NETWORK = f"{PREFIX}-net"
REPO = Path(__file__).resolve().parents[1]
START = "# >>> gpulab managed block: written by %gpu_install, do not edit by hand >>>"
END = "# <<< gpulab managed block <<<"


def managed_line(package: str, module: str) -> str:
    return f'RUN pip install --no-cache-dir {package} && python -c "import {module}"'


def project_dockerfile(base: str, lines: list[str]) -> str:
    return "\n".join([f"FROM {base}", START, *lines, END, ""])


def timed(fn):
    t = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t


def pip_alone(dk: host.Docker, image: str, package: str) -> float:
    """Seconds that pip install takes by itself, inside a container of ``image``."""
    code = (
        "import subprocess, sys, time; t = time.perf_counter(); "
        f"subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--no-cache-dir', "
        f"'{package}'], check=True); print(time.perf_counter() - t)"
    )
    out = subprocess.run(
        ["docker", "run", "--rm", "--network", NETWORK, image, "python", "-c", code],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def cleanup(dk: host.Docker) -> None:
    for c in dk.call("containers", all=True, filters={"ancestor": f"{PREFIX}/project"}):
        dk.call("remove_container", c["Id"], force=True)
    for repo in ("project", "base", "debian"):
        for img in dk.call("images", name=f"{PREFIX}/{repo}"):
            for tag in img.get("RepoTags") or []:
                try:
                    dk.call("remove_image", tag, force=True)
                except docker.errors.APIError:
                    pass
    dk.call("prune_images", filters={"dangling": True})
    for net in dk.call("networks", names=[NETWORK]):
        dk.call("remove_network", net["Id"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--package", default="numpy==2.1.3", help="pinned requirement to append")
    ap.add_argument("--module", default="numpy", help="its import name")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="gpulab-rebuild-") as tmp:
        state = Path(tmp)
        dk = host.Docker()
        started = host.ensure_dockerd(dk, state)
        try:
            cleanup(dk)
            host.ensure_network(dk, NETWORK)
            debian = host.ensure_local_debian(dk, f"{PREFIX}/debian:bookworm", host.cache_dir())
            wheels = host.user_wheels(REPO, state / "wheels")
            spec = baseimage.BaseSpec(debian)
            project = Project(state / "projects", "bench", "rebuild", state / "project-state")
            project.path.mkdir(parents=True)
            base_tag = f"{PREFIX}/base:latest"
            first = ["RUN pip install --no-cache-dir six==1.16.0 && python -c 'import six'"]
            project.dockerfile.write_text(project_dockerfile(base_tag, first))

            def full():
                baseimage.ensure(
                    dk.call,
                    REPO / "images",
                    spec,
                    wheels,
                    host.HOST_CA_DIR,
                    state / "base.log",
                    lambda line: None,
                    base_tag,
                    network=NETWORK,
                )
                return projectimage.ensure_image(
                    dk.call,
                    project,
                    state / "locks",
                    lambda line: None,
                    1800,
                    repo=f"{PREFIX}/project",
                    network=NETWORK,
                    allowed=(base_tag,),
                )

            _, full_s = timed(full)
            project.dockerfile.write_text(
                project_dockerfile(base_tag, first + [managed_line(args.package, args.module)])
            )
            lines: list[str] = []
            tag, rebuild_s = timed(
                lambda: projectimage.ensure_image(
                    dk.call,
                    project,
                    state / "locks",
                    lines.append,
                    1800,
                    repo=f"{PREFIX}/project",
                    network=NETWORK,
                    allowed=(base_tag,),
                )
            )
            cached = sum(1 for line in lines if line.strip() == "---> Using cache")
            steps = sum(1 for line in lines if line.startswith("Step "))
            base_only = images.base_of(project.dockerfile.read_text())
            alone = pip_alone(dk, base_only, args.package)
            print(f"package appended:            {args.package}")
            print(f"full build (base + project): {full_s:7.2f} s")
            print(
                f"rebuild after one line:      {rebuild_s:7.2f} s  ({cached}/{steps} steps cached)"
            )
            print(f"that pip install alone:      {alone:7.2f} s")
            print(f"rebuild / full build:        {rebuild_s / full_s:7.3f}")
            print(f"image: {tag}")
            print(f"rebuild_ratio={rebuild_s / alone:.2f}")
        finally:
            cleanup(dk)
            if started:
                host.stop_dockerd(state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
