"""The options of ``%gpu_install`` (parsed from the magic's line, never through a shell)."""

from __future__ import annotations

import argparse
import math
import shlex
from dataclasses import dataclass, field

from .spec import (
    Spec,
    SpecError,
    check_apt,
    check_code,
    check_host,
    check_module,
    check_url,
    parse_spec,
)

USAGE = "%gpu_install [options] PACKAGE[==VERSION] [PACKAGE ...]"
DESCRIPTION = """\
Install packages into this kernel's environment, verify them in a fresh
interpreter (imports; for CUDA code, this GPU's architecture), and only then
record one pinned RUN line per package in the managed block of the project's
Dockerfile, so the next build has them too. On any failure the Dockerfile is
untouched and the environment is put back as it was."""


MAX_JOBS = 1024
MAX_TIMEOUT = 7 * 24 * 3600.0  # seconds


def _jobs(text: str) -> int:
    """--jobs: a whole number from 1 to MAX_JOBS (no huge or non-numeric values)."""
    if not (text.isascii() and text.isdigit() and len(text) <= 6 and 1 <= int(text) <= MAX_JOBS):
        raise argparse.ArgumentTypeError(
            f"must be a whole number from 1 to {MAX_JOBS}, not {text[:40]!r}"
        )
    return int(text)


def _seconds(text: str) -> float:
    """--timeout: a finite number of seconds, more than 0 and at most MAX_TIMEOUT."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds above 0 and at most {MAX_TIMEOUT:.0f}, not {text[:40]!r}"
        )
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise SpecError(f"%gpu_install: {message} (see %gpu_install?)")


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="%gpu_install",
        usage=USAGE.replace("%", "%%", 1),
        description=DESCRIPTION,
        allow_abbrev=False,
    )
    p.add_argument("packages", nargs="*", help="PEP 508 specs: name, extras, version")
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="module to import when verifying (default: its top-level modules)",
    )
    p.add_argument(
        "--check",
        default="",
        metavar="CODE",
        help="Python code run after the imports in the fresh interpreter (a smoke test)",
    )
    p.add_argument(
        "--apt",
        action="append",
        default=[],
        metavar="NAME",
        help="record a Debian package for the next build (a rebuild applies it)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="resolve and show the RUN line(s) that would be written; change nothing",
    )
    p.add_argument(
        "--no-build-isolation",
        dest="isolation",
        action="store_false",
        default=None,
        help="build against the installed packages (torch); default: automatic",
    )
    p.add_argument(
        "--build-isolation",
        dest="isolation",
        action="store_true",
        help="build in pip's isolated environment",
    )
    p.add_argument(
        "--from-source",
        action="store_true",
        help="compile the named packages here instead of using prebuilt wheels",
    )
    p.add_argument("--jobs", type=_jobs, metavar="N", help="parallel compile jobs (MAX_JOBS)")
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=3600.0,
        metavar="SECONDS",
        help="stop pip after this long (default 3600)",
    )
    p.add_argument(
        "--allow-torch-change",
        action="store_true",
        help="allow replacing torch, torchvision, torchaudio, triton, nvidia-*",
    )
    p.add_argument("--allow-url", action="store_true", help="allow NAME @ URL specs")
    p.add_argument("--allow-local", action="store_true", help="allow local wheels, sdists, folders")
    p.add_argument("--index-url", metavar="URL", help="package index instead of PyPI")
    p.add_argument("--extra-index-url", action="append", default=[], metavar="URL")
    p.add_argument("--find-links", action="append", default=[], metavar="URL_OR_FOLDER")
    p.add_argument(
        "--trusted-host",
        action="append",
        default=[],
        metavar="HOST",
        help="let pip use this host's plain-http index (recorded with the index)",
    )
    p.add_argument("--no-index", action="store_true", help="only use --find-links locations")
    p.add_argument("--pre", action="store_true", help="allow pre-releases")
    return p


@dataclass
class Options:
    specs: list[Spec] = field(default_factory=list)
    imports: list[str] = field(default_factory=list)
    check: str = ""
    apt: list[str] = field(default_factory=list)
    dry_run: bool = False
    isolation: bool | None = None
    from_source: bool = False
    jobs: int | None = None
    timeout: float = 3600.0
    allow_torch_change: bool = False
    index_url: str = ""
    extra_index_urls: list[str] = field(default_factory=list)
    find_links: list[str] = field(default_factory=list)
    trusted_hosts: list[str] = field(default_factory=list)
    no_index: bool = False
    pre: bool = False

    def index_options(self) -> list[str]:
        """Where this machine's pip looks for packages."""
        out = []
        if self.index_url:
            out += ["--index-url", self.index_url]
        for url in self.extra_index_urls:
            out += ["--extra-index-url", url]
        for loc in self.find_links:
            out += ["--find-links", loc]
        for host in self.trusted_hosts:
            out += ["--trusted-host", host]
        if self.no_index:
            out.append("--no-index")
        return out

    def pip_options(self) -> list[str]:
        """Options of this machine's pip install run."""
        out = self.index_options()
        if self.pre:
            out.append("--pre")
        if self.from_source:
            out += ["--no-binary", ",".join(s.name for s in self.specs)]
        return out

    def recorded_options(self, name: str) -> list[str]:
        """Index options a build can use too (URLs, not this machine's folders)."""
        out = []
        if self.index_url:
            out += ["--index-url", self.index_url]
        for url in self.extra_index_urls:
            out += ["--extra-index-url", url]
        for loc in self.find_links:
            if loc.startswith(("http://", "https://")):
                out += ["--find-links", loc]
        for host in self.trusted_hosts:
            out += ["--trusted-host", host]
        if self.from_source:
            out += ["--no-binary", name]
        return out

    @property
    def local_locations(self) -> list[str]:
        return [loc for loc in self.find_links if not loc.startswith(("http://", "https://"))]


def parse(line: str) -> Options | None:
    """Options from the magic's line; None when help was asked for (it is printed)."""
    try:
        tokens = shlex.split(line, posix=True)
    except ValueError as e:
        raise SpecError(f"%gpu_install: cannot split the line ({e}).") from e
    if any(t in ("-h", "--help") for t in tokens):
        print(parser().format_help())
        return None
    a = parser().parse_args(tokens)
    specs = [parse_spec(t, allow_url=a.allow_url, allow_local=a.allow_local) for t in a.packages]
    if not specs and not a.apt:
        raise SpecError(f"%gpu_install: name at least one package. Usage: {USAGE}")
    names = [s.name for s in specs]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise SpecError(f"%gpu_install: {', '.join(sorted(dupes))} named more than once.")
    return Options(
        specs=specs,
        imports=[check_module(m) for m in a.imports],
        check=check_code(a.check),
        apt=[check_apt(n) for n in a.apt],
        dry_run=a.dry_run,
        isolation=a.isolation,
        from_source=a.from_source,
        jobs=a.jobs,
        timeout=a.timeout,
        allow_torch_change=a.allow_torch_change,
        index_url=check_url(a.index_url, "--index-url") if a.index_url else "",
        extra_index_urls=[check_url(u, "--extra-index-url") for u in a.extra_index_url],
        find_links=[check_url(u, "--find-links", allow_path=True) for u in a.find_links],
        trusted_hosts=[check_host(h) for h in a.trusted_host],
        no_index=a.no_index,
        pre=a.pre,
    )
