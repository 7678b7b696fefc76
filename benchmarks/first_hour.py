"""The first hour, as a user waits for it: click "start" to a usable JupyterLab.

In Chromium (Debian's, driven by Playwright), on a hub of its own (`gpulab up`,
everything named gpulabbench-fh*, removed at the start and the end), one user and
one project; each figure is from the click that starts the project (the home page's
"Create and start" for a new one, the start page's button after) until JupyterLab's
file browser shows the Dockerfile:

1. ``first``: a new project's first start (its image is built from the template);
2. ``pip_line``: a start after the Dockerfile gained one pip RUN line in its managed
   block, the way %gpu_install writes it (a small pure-Python package);
3. ``unchanged``: a start with the Dockerfile unchanged (the image is reused);
4. ``failure``: a start whose Dockerfile ends in a step that fails at once, until the
   page shows why (the build log's last lines).

And a cell's **first output** (benchmarks/first_output.py): ``--rounds`` times, a start of
the stopped project (its image cached) from the start page's button to the printed line
of a new notebook's first cell, split into its parts (spawn, proxy, lab, notebook, run);
in the same run, alternating with it, the anchor: a plain ``jupyter lab`` (its own venv,
the images' JupyterLab, no hub, no container, the same browser) from the command that
starts it to the same printed line.

Not part of `make test`. Needs root, a Docker engine, Debian's chromium and the
package index reachable from builds.

    .venv/bin/python benchmarks/first_hour.py [--package six==1.17.0 --module six] [--rounds 5]

Last line: ``first_hour first=<s> pip_line=<s> unchanged=<s> failure=<s>
first_output_p50=<s> first_output_p95=<s> plain_p50=<s> first_output_ratio=<p50 / plain p50>``.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import first_output
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, sync_playwright
from spawn import BenchError, Hub, say

from gpulab_hub import host
from gpulab_hub.images import base

PREFIX = "gpulabbench-fh"
PROJECT = "first-hour"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
MANAGED_END = "# <<< gpulab managed block <<<"
READY_TIMEOUT_MS = 600_000


def cleanup(dk: host.Docker) -> None:
    """Remove this benchmark's containers, images and volumes (its prefix only)."""
    for c in dk.call("containers", all=True, filters={"name": PREFIX}):
        if any(name.startswith(f"/{PREFIX}-") for name in c["Names"]):
            dk.call("remove_container", c["Id"], force=True, v=True)
    host.remove_image_trees(dk, PREFIX)
    for vol in dk.call("volumes").get("Volumes") or []:
        if vol["Name"].startswith(f"{PREFIX}-"):
            dk.call("remove_volume", vol["Name"], force=True)
    for net in dk.call("networks", names=[PREFIX]):
        if net["Name"] == f"{PREFIX}-net" and not net.get("Containers"):
            dk.call("remove_network", net["Id"])


def pip_line(package: str, module: str) -> str:
    """A managed-block line as %gpu_install writes it (magics/runline.py)."""
    cmd = ["python", "-m", "pip", "install", "--no-cache-dir", package]
    return (
        "RUN "
        + " ".join(map(shlex.quote, cmd))
        + " && python -c "
        + shlex.quote(f"import {module}")
    )


def add_managed_line(dockerfile: Path, line: str) -> None:
    text = dockerfile.read_text()
    if MANAGED_END not in text:
        raise BenchError(f"{dockerfile} has no managed block")
    dockerfile.write_text(text.replace(MANAGED_END, f"{line}\n{MANAGED_END}", 1))


def log_in(page: Page, base: str, name: str, password: str) -> None:
    page.goto(f"{base}/hub/login")
    page.get_by_label("Username").fill(name)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign In").click()
    page.wait_for_url("**/hub/**")


def start(page: Page, base: str, user: str, new: bool) -> None:
    """What the user clicks: a new project is named on the home page and created and
    started there; a stopped one is started from its start page's button (a GET of
    that page only shows it)."""
    if new:
        page.goto(f"{base}/hub/home")
        page.get_by_label("New project").fill(PROJECT)
        page.get_by_role("button", name="Create and start", exact=True).click()
    else:
        page.goto(f"{base}/hub/spawn/{user}/{PROJECT}")
        page.get_by_role("button", name=re.compile(r"^Start ")).first.click()


def until_lab(page: Page, base: str, user: str, new: bool = False) -> float:
    """Seconds from the click that starts the project to the Dockerfile in
    JupyterLab's file browser."""
    t0 = time.perf_counter()
    start(page, base, user, new)
    page.locator("#filebrowser").get_by_text("Dockerfile", exact=True).wait_for(
        timeout=READY_TIMEOUT_MS
    )
    return time.perf_counter() - t0


def until_reason(page: Page, base: str, user: str) -> float:
    """Seconds from the click that starts the project to the failure's reason."""
    t0 = time.perf_counter()
    start(page, base, user, new=False)
    page.locator("pre.gpulab-log-tail").first.wait_for(timeout=READY_TIMEOUT_MS)
    return time.perf_counter() - t0


def gpulab_round(page: Page, hub: Hub, user: str, n: int) -> first_output.Measure:
    """One stopped project's start from its start page, to a new notebook's output."""
    m = first_output.Measure()
    page.goto(f"{hub.url}/hub/spawn/{user}/{PROJECT}")
    button = page.get_by_role("button", name=re.compile(r"^Start ")).first
    button.wait_for()
    hub.running.add(PROJECT)
    clicked = time.time()
    button.click()
    page.wait_for_url(f"**/user/{user}/{PROJECT}/**", timeout=READY_TIMEOUT_MS)
    first_output.after_navigation(page, clicked, m)
    first_output.new_notebook_output(page, n, m)
    return m


def first_outputs(page: Page, hub: Hub, user: str, args, tmp: Path) -> dict[str, float]:
    """``--rounds`` gpulab rounds and as many plain ones, alternating (the machine's
    load falls on both alike)."""
    plain = first_output.PlainLab(tmp, base.JUPYTERLAB_VERSION, metadata.version("ipykernel"))
    say("installing the anchor's plain JupyterLab (its own venv)")
    plain.install()
    ours: list[first_output.Measure] = []
    theirs: list[first_output.Measure] = []
    for n in range(1, args.rounds + 1):
        ours.append(gpulab_round(page, hub, user, n))
        hub.stop(PROJECT)
        theirs.append(first_output.plain_round(page, plain, n))
        say(f"round {n}: gpulab {ours[-1].total:.2f} s, plain JupyterLab {theirs[-1].total:.2f} s")
    say(first_output.line("gpulab, click to first output", ours))
    say(first_output.line("plain jupyter lab, command to first output", theirs))
    say(first_output.slowest("gpulab", ours[-1]))
    say(first_output.slowest("plain jupyter lab", theirs[-1]))
    a, b = first_output.summary(ours), first_output.summary(theirs)
    return {
        "first_output_p50": a["p50"],
        "first_output_p95": a["p95"],
        "plain_p50": b["p50"],
        "first_output_ratio": a["p50"] / b["p50"],
    }


def measure(hub: Hub, args, tmp: Path) -> dict[str, float]:
    user = hub.make_user()
    dockerfile = hub.home / "projects" / user.name / PROJECT / "Dockerfile"
    out: dict[str, float] = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
            log_in(page, hub.url, user.name, user.password)
            hub.running.add(PROJECT)
            out["first"] = until_lab(page, hub.url, user.name, new=True)
            say(f"first start of a new project: {out['first']:.1f} s")
            hub.stop(PROJECT)

            if not args.only_output:
                add_managed_line(dockerfile, pip_line(args.package, args.module))
                hub.running.add(PROJECT)
                out["pip_line"] = until_lab(page, hub.url, user.name)
                say(f"start after one pip line ({args.package}): {out['pip_line']:.1f} s")
                hub.stop(PROJECT)

            hub.running.add(PROJECT)
            out["unchanged"] = until_lab(page, hub.url, user.name)
            say(f"start with the Dockerfile unchanged: {out['unchanged']:.1f} s")
            hub.stop(PROJECT)

            if args.rounds:
                out.update(first_outputs(page, hub, user.name, args, tmp))

            if not args.only_output:
                dockerfile.write_text(dockerfile.read_text() + "RUN false\n")
                out["failure"] = until_reason(page, hub.url, user.name)
                say(f"start to the reason of a failed build: {out['failure']:.1f} s")
        except PlaywrightError as e:
            shot = Path(tempfile.gettempdir()) / "gpulab-first-hour-failed.png"
            page.screenshot(path=shot)
            raise BenchError(f"the browser did not get there (screenshot {shot}): {e}") from e
        finally:
            browser.close()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--package", default="six==1.17.0", help="pip requirement of the line")
    ap.add_argument("--module", default="six", help="module the line imports to verify it")
    ap.add_argument("--rounds", type=int, default=5, help="first-output rounds per side (0: none)")
    ap.add_argument(
        "--only-output", action="store_true", help="skip pip_line and failure (first output only)"
    )
    args = ap.parse_args(argv)
    dk = host.Docker()
    cleanup(dk)
    with tempfile.TemporaryDirectory(prefix="gpulab-first-hour-") as tmp:
        hub = Hub("gpulab", Path(tmp), PREFIX, 1)
        hub.env.update(
            {
                "GPULAB_IMAGE_REPO": f"{PREFIX}/project",
                "GPULAB_BASE_IMAGE": f"{PREFIX}/base:latest",
                "GPULAB_BASE_FROM": f"{PREFIX}/debian:bookworm",
                "GPULAB_SSH_PORT": "0",  # beside a running hub: no gateway of its own
            }
        )
        try:
            say("starting a hub (gpulab up; the first run builds its base image)")
            t0 = time.perf_counter()
            hub.start_gpulab()
            say(f"hub up in {time.perf_counter() - t0:.0f} s")
            res = measure(hub, args, Path(tmp))
        except BenchError as e:
            say(f"first_hour: {e}\n--- hub log ---\n{hub.log_tail()}")
            return 1
        finally:
            try:
                hub.shutdown()
            except BenchError as e:
                say(f"first_hour: {e}")
            cleanup(dk)
    say("first_hour " + " ".join(f"{k}={v:.2f}" for k, v in res.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
