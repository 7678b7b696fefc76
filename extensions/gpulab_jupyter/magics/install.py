"""``%gpu_install``: resolve, build, install, verify, record; or undo everything."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from packaging.utils import canonicalize_name

from gpulab_contract.environment import project_dir

from . import buildenv, dockerfile, options, pipenv, piplog, verify
from .progress import Progress, say
from .runline import run_line
from .spec import SpecError


class InstallFailed(Exception):
    """The install failed and was undone; ``str()`` is the one-line summary."""


def _pip_args(opts, benv, constraint_file: str | None, extra=()) -> list[str]:
    args = ["install", "-v", "--no-input", "--progress-bar", "off", "--disable-pip-version-check"]
    args += opts.pip_options()
    if benv.no_build_isolation:
        args.append("--no-build-isolation")
    if constraint_file:
        args += ["-c", constraint_file]
    return args + list(extra) + [s.pip_arg for s in opts.specs]


def _insecure(hosts: list[str]) -> list[str]:
    """Why pip found nothing at a plain-http index, and what to do."""
    out = []
    for host in hosts:
        out.append(
            f"pip ignored the package index at {host}: it is plain http:// and {host} is not "
            'a trusted host, so pip did not look there at all (hence "No matching '
            'distribution" below).'
        )
    host = hosts[0]
    out.append(
        "Use the index's https:// address if it has one; or, if you trust the network "
        f"between this project and {host}, add --trusted-host {host} "
        "(it is written to the Dockerfile with the index, so builds use it too)."
    )
    return out


def _refusal(opts, run, benv=None) -> list[str]:
    pins = piplog.constraint_conflicts(run.lines)
    if pins and not opts.allow_torch_change:
        because = [ln.strip() for ln in run.lines if "depends on" in ln or "(constraint)" in ln]
        return [
            f"Refused: this install would replace the image's torch stack ({', '.join(pins)}).",
            *(f"    {ln}" for ln in because[:8]),
            "The torch stack (torch, torchvision, torchaudio, triton, nvidia-*) stays as the "
            "image built it. To change it on purpose pass --allow-torch-change (better: "
            "change the base image in the Dockerfile).",
        ]
    words = []
    hosts = piplog.insecure_hosts(run.lines)
    if hosts:
        words += _insecure(hosts)
    if benv is not None and benv.notes and piplog.cuda_build(run.lines):
        words += benv.notes  # a CUDA build with no GPU to build for
    if run.timed_out:
        words.append(f"pip was stopped after {opts.timeout:.0f} s (--timeout).")
    if piplog.out_of_memory(run.lines):
        words.append("The compiler ran out of memory and was killed: lower --jobs.")
    return words + [f"    {ln}" for ln in piplog.relevant(run.lines)]


class Installer:
    def __init__(self, opts: options.Options, project: Path):
        self.opts, self.project = opts, project
        self.names = [s.name for s in opts.specs]
        self.dockerfile = project / "Dockerfile"
        self.user = f"{os.getuid()}:{os.getgid()}"
        self.log_path = pipenv.log_file(project, self.names)
        self.progress = Progress(" ".join(s.text for s in opts.specs), log=self.log_path)
        self.tmp = Path(tempfile.mkdtemp(prefix="gpulab-install-"))
        self.manifest = self.tmp / "uninstalled.jsonl"
        self.before: dict | None = None

    def fail(self, stage: str, lines: list[str], before=None) -> None:
        restored = ""
        if before is not None:
            index = self.opts.index_options()
            problems = pipenv.revert(before, self.manifest, self.log_path, dict(os.environ), index)
            restored = (
                f" could not restore {', '.join(problems)}"
                if problems
                else " the environment is as it was"
            )
        self.progress.finish(False)
        label = " ".join(self.names)
        say(f"%gpu_install {label} failed while {stage}:", error=True)
        for line in lines:
            say(line, error=True)
        say(f"The Dockerfile is unchanged;{restored or ' nothing was installed'}.", error=True)
        say(f"Full log: {self.log_path}", error=True)
        raise InstallFailed(f"{label}: failed while {stage} (Dockerfile unchanged)")

    def pip(self, benv, before, extra=()) -> pipenv.PipRun:
        constraint_file = None
        pins = [] if self.opts.allow_torch_change else pipenv.constraints(before)
        if pins:
            constraint_file = str(self.tmp / "torch-stack.txt")
            Path(constraint_file).write_text("\n".join(pins) + "\n")
        env = {**os.environ, **benv.env, "PIP_NO_INPUT": "1"}

        def on_line(line):
            self.progress.line(line)
            stage = piplog.stage_of(line)
            if stage and not extra:
                self.progress.stage(stage)

        args = _pip_args(self.opts, benv, constraint_file, extra)
        arch = benv.env.get("TORCH_CUDA_ARCH_LIST")
        if arch:  # pip's wheel cache does not know the arch: one cache per arch list
            base = os.environ.get("PIP_CACHE_DIR") or Path.home() / ".cache" / "pip"
            args[1:1] = ["--cache-dir", str(Path(base) / "gpulab-arch" / arch.replace(";", "_"))]
        return pipenv.run_pip(args, self.manifest, self.log_path, env, self.opts.timeout, on_line)

    def run(self, gpus: buildenv.GpuReport) -> None:
        self.progress.stage("resolving")
        before = self.before = pipenv.snapshot()
        benv = buildenv.build_env(
            self.names, gpus, "torch" in before, self.opts.jobs, self.opts.isolation
        )
        if self.opts.dry_run:
            return self.dry_run(benv, before)
        run = self.pip(benv, before)
        retry = self.opts.isolation is None and run.returncode not in (0, -2)
        if retry and not benv.no_build_isolation and piplog.needs_torch_at_build(run.lines):
            say("The build imports torch: retrying without build isolation.")
            benv.no_build_isolation = True
            run = self.pip(benv, before)
        elif retry and benv.no_build_isolation and piplog.missing_build_backend(run.lines):
            say("The build backend is not installed here: retrying with build isolation.")
            benv.no_build_isolation = False
            run = self.pip(benv, before)
        if run.interrupted:
            self.fail("installing (interrupted)", [], before)
        if run.returncode != 0:
            self.fail(self.progress.current or "resolving", _refusal(self.opts, run, benv), before)
        self.verify_and_record(benv, before, gpus, piplog.compiled(run.lines))

    def verify_and_record(self, benv, before, gpus, built: set[str]) -> None:
        """Verify, then record; ``built``: the packages compiled here (platform wheels)."""
        self.progress.stage("verifying")
        after = pipenv.snapshot()
        gone = [n for n in self.names if n not in after]
        if gone:
            self.fail("verifying", [f"pip reported success but {', '.join(gone)} is not visible "
                                    "to this kernel's interpreter."], before)  # fmt: skip
        modules = {n: self.opts.imports or verify.top_level_modules(n) for n in self.names}
        self.modules = modules
        wanted = sorted({m for ms in modules.values() for m in ms})
        verdict = verify.import_check(wanted, self.opts.check)
        problems = list(verdict.problems)
        notes = list(verdict.notes)
        if built and benv.notes:  # compiled with no GPU to build for: say so
            notes += [f"{', '.join(sorted(built))}: {n}" for n in benv.notes]
        for name in self.names:
            gpu = verify.gpu_check(name, gpus.capabilities, gpus.problem)
            problems += gpu.problems
            notes += gpu.notes
        if problems:
            self.fail("verifying", [f"    {p}" for p in problems], before)
        self.progress.stage("recording")
        lines = []
        for spec in self.opts.specs:
            compiled = spec.name in built
            env = benv.env if compiled else {}
            iso = benv.no_build_isolation and compiled
            mods = [m for m in modules[spec.name] if m in verdict.modules]
            version = after[spec.name].version
            lines.append((spec.name, run_line(spec, version, self.opts, env, iso, mods)))
        try:
            dockerfile.update(self.dockerfile, lines, self.opts.apt, self.user)
        except (dockerfile.DockerfileError, OSError) as e:
            self.fail("recording", [f"    {e}"], before)
        pipenv.finalize(self.manifest)
        self.progress.finish(True)
        self.report(before, after, lines, notes)

    def report(self, before, after, lines, notes) -> None:
        got = ", ".join(f"{n} {after[n].version}" for n in self.names)
        say(f"✔ {got}: installed, verified and written to the Dockerfile ({self.dockerfile}):")
        for _, line in lines:
            say(f"    {line}")
        deps = [f"{n} {after[n].version}" for n in pipenv.changed(before, after)]
        deps = [d for d in deps if d.split()[0] not in self.names]
        if deps:
            say(f"  with: {', '.join(deps)}")
        for note in notes:
            say(f"  {note}")
        stale = [n for n in self.names if n in before and before[n] != after[n]]
        loaded = [m for n in stale for m in self.modules.get(n, []) if m in sys.modules]
        if loaded:
            say(
                f"  {', '.join(loaded)} was imported before: restart the kernel to use "
                "the new version."
            )
        if self.opts.apt:
            say(f"  apt: {' '.join(self.opts.apt)} recorded; a rebuild (restart the project) "
                "installs it.")  # fmt: skip
        local = [s.text for s in self.opts.specs if s.local or s.url.startswith("file:")]
        local += self.opts.local_locations
        if local:
            say(f"  Note: {', '.join(local)} is not visible to image builds; the build installs "
                "the pinned versions from the package index.")  # fmt: skip

    def dry_run(self, benv, before) -> None:
        report_file = self.tmp / "report.json"
        run = self.pip(benv, before, extra=["--dry-run", "--report", str(report_file)])
        if run.returncode != 0:
            self.fail("resolving (dry run)", _refusal(self.opts, run))
        found = {}
        if report_file.exists():
            for item in json.loads(report_file.read_text()).get("install", []):
                meta = item.get("metadata", {})
                found[canonicalize_name(meta.get("name", ""))] = meta.get("version", "")
        self.progress.finish(True)
        say("%gpu_install --dry-run: nothing was installed and the Dockerfile is unchanged.")
        say("It would record:")
        for spec in self.opts.specs:
            version = found.get(spec.name) or (
                before[spec.name].version if spec.name in before else "?"
            )
            modules = self.opts.imports or verify.top_level_modules(spec.name)
            modules = modules or [spec.name.replace("-", "_")]
            say(f"    {run_line(spec, version, self.opts, {}, False, modules)}")
        if self.opts.apt:
            say("    " + dockerfile.APT_RUN.format(packages=" ".join(sorted(self.opts.apt))))
        if benv.env:
            env = " ".join(f"{k}={v}" for k, v in benv.env.items())
            say(f"  (packages built from source also get: {env})")


def record_apt(opts: options.Options, project: Path) -> None:
    user = f"{os.getuid()}:{os.getgid()}"
    if opts.dry_run:
        say("%gpu_install --dry-run: it would record (the Dockerfile is unchanged):")
        say("    " + dockerfile.APT_RUN.format(packages=" ".join(sorted(opts.apt))))
        return
    dockerfile.update(project / "Dockerfile", [], opts.apt, user)
    say(f"✔ apt: {' '.join(opts.apt)} recorded in {project / 'Dockerfile'}.")
    say("  System packages are installed by the image build: restart the project to rebuild.")


def gpu_install(line: str) -> None:
    """Entry point of the magic; raises SpecError, DockerfileError or InstallFailed."""
    from filelock import FileLock, Timeout

    opts = options.parse(line)
    if opts is None:
        return
    project = project_dir()
    path = project / "Dockerfile"
    if not path.is_file():
        raise dockerfile.DockerfileError(
            f"There is no Dockerfile at {path} (GPULAB_PROJECT_DIR={project}), so nothing could "
            "be recorded: nothing was installed."
        )
    dockerfile.split(path.read_bytes().decode("utf-8", "surrogateescape"))  # fails early
    if not opts.specs:
        return record_apt(opts, project)
    gpus = buildenv.detect_gpus()
    lock = FileLock(pipenv.env_lock_path())
    try:
        lock.acquire(timeout=0)
    except Timeout:
        say("Another %gpu_install is running in this environment: waiting for it to finish…")
        lock.acquire()
    try:
        installer = Installer(opts, project)
        try:
            installer.run(gpus)
        except KeyboardInterrupt:
            installer.fail("installing (interrupted)", [], installer.before)
        finally:
            installer.progress.finish(False)  # no-op when it ended normally
            shutil.rmtree(installer.tmp, ignore_errors=True)
    finally:
        lock.release()


__all__ = ["InstallFailed", "SpecError", "gpu_install", "project_dir"]
