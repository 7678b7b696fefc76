"""Full build vs rebuild after one appended managed-block line.

Builds gpulab's CPU base image and a project image on it from scratch (no
cache), appends one install line to the project's managed block, rebuilds
through gpulab's pipeline, and times that pip install alone in a container of
the same image. Everything it makes is named ``gpulabbench-rebuild`` and
removed at the end.

    .venv/bin/python benchmarks/rebuild.py [--package numpy==2.1.3 --module numpy] [--rounds 3]

Each round appends a line of its own and prints where the rebuild's seconds went.
Last line: ``rebuild_ratio=<median of rebuild after one appended line / that pip install
alone>``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from functools import partial
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


class Timeline:
    """Wraps a ``docker_call`` and times where a rebuild's seconds go: the build network
    (made and removed per build), the build call up to its first step (context upload,
    the engine's set-up), the new step's container (from "Running in" to its last line),
    the layer's commit (its last line to "Removing intermediate container"), and the
    rest of the build call (tagging)."""

    def __init__(self, dk: host.Docker):
        self.dk = dk
        self.parts: dict[str, float] = {}

    def add(self, part: str, seconds: float) -> None:
        self.parts[part] = self.parts.get(part, 0.0) + seconds

    def __call__(self, method, *args, **kwargs):
        t = time.perf_counter()
        result = self.dk.call(method, *args, **kwargs)
        if method in ("create_network", "remove_network"):
            self.add("network", time.perf_counter() - t)
        if method != "build":
            return result
        return self._stream(result, t)

    def _stream(self, chunks, t0):
        first_step = running = last_line = removing = None
        for chunk in chunks:
            now = time.perf_counter()
            text = (chunk.get("stream") or "").strip()
            if text.startswith("Step ") and first_step is None:
                first_step = now
            elif text.startswith("---> Running in"):
                running = now
            elif text.startswith("Removing intermediate container"):
                removing = now
            elif text and running is not None and removing is None:
                last_line = now
            yield chunk
        end = time.perf_counter()
        if first_step is not None:
            self.add("build call to its first step", first_step - t0)
        if running is not None and last_line is not None and removing is not None:
            self.add("the new step's container", last_line - running)
            self.add("layer commit", removing - last_line)
            self.add("tag and finish", end - removing)


def median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--package", default="numpy==2.1.3", help="pinned requirement to append")
    ap.add_argument("--module", default="numpy", help="its import name")
    ap.add_argument("--rounds", type=int, default=1, help="rebuilds, each after a new line")
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

            def project_build(call, on_line=lambda line: None):
                return projectimage.ensure_image(
                    call,
                    project,
                    state / "locks",
                    on_line,
                    1800,
                    repo=f"{PREFIX}/project",
                    network=NETWORK,
                    allowed=(base_tag,),
                )

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
                return project_build(dk.call)

            _, full_s = timed(full)
            print(f"package appended:            {args.package}")
            print(f"full build (base + project): {full_s:7.2f} s")
            ratios, rebuilds, alones = [], [], []
            for n in range(1, args.rounds + 1):
                # a line of its own each round, so Docker's cache holds none of it
                line = managed_line(args.package, args.module) + f" && echo round {n}"
                project.dockerfile.write_text(project_dockerfile(base_tag, first + [line]))
                lines: list[str] = []
                timeline = Timeline(dk)
                tag, rebuild_s = timed(partial(project_build, timeline, lines.append))
                cached = sum(1 for line in lines if line.strip() == "---> Using cache")
                steps = sum(1 for line in lines if line.startswith("Step "))
                alone = pip_alone(dk, images.base_of(project.dockerfile.read_text()), args.package)
                ratios.append(rebuild_s / alone)
                rebuilds.append(rebuild_s)
                alones.append(alone)
                print(
                    f"round {n}: rebuild after one line {rebuild_s:6.2f} s "
                    f"({cached}/{steps} steps cached), that pip install alone {alone:6.2f} s, "
                    f"ratio {rebuild_s / alone:.2f}"
                )
                shown = sum(timeline.parts.values())
                for part, seconds in timeline.parts.items():
                    print(f"    {part + ':':32s}{seconds:6.2f} s")
                print(f"    {'the rest (plan, locks, record):':32s}{rebuild_s - shown:6.2f} s")
            print(f"rebuild p50: {median(rebuilds):.2f} s, pip alone p50: {median(alones):.2f} s")
            print(f"rebuild / full build:        {median(rebuilds) / full_s:7.3f}")
            print(f"image: {tag}")
            print(f"rebuild_ratio={median(ratios):.2f}")
        finally:
            cleanup(dk)
            if started:
                host.stop_dockerd(state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
