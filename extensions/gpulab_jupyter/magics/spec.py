"""Validation of what a user types after ``%gpu_install`` (untrusted input).

Every package spec must be a PEP 508 requirement: a name, optional extras and
version specifiers. Local paths and URLs are accepted only when the user
allowed them explicitly; pip options smuggled into a spec (``--index-url``,
``-r``, ``-e``) are refused, because specs are handed to pip one argument
each and written into the Dockerfile.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)

from gpulab_contract import managed_block  # the hub reads these lines back

TORCH_STACK = ("torch", "torchvision", "torchaudio", "triton")
URL_SCHEMES = ("https", "http", "git+https", "git+http", "git+ssh", "hg+https", "svn+https")
ARCHIVES = (".whl", ".tar.gz", ".zip", ".tar.bz2", ".tgz")
# Whole-value patterns: used with fullmatch only (``$`` would also accept a value
# that ends in a newline, which would then start a new line of the Dockerfile).
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}(\.[A-Za-z_][A-Za-z0-9_]{0,99}){0,20}")
MAX_CHECK = 2000  # characters of --check code
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_OPTION = re.compile(r"(^|[\s;,])-{1,2}[A-Za-z]")
_ONE_OPTION = re.compile(r"-{1,2}[A-Za-z][A-Za-z0-9-]*(=\S*)?")  # one word: "--index-url=…"
_SHELL = re.compile(r"[;&|`$<>]")
MAX_SHOWN = 80  # characters of a refused spec repeated in the message
_DIRECT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\s*(\[[^\]]*\])?\s*@")


class SpecError(ValueError):
    """A spec or option the user typed was refused; ``str()`` says why."""


def is_torch_stack(name: str) -> bool:
    """Part of the image's torch stack (pinned while installing)."""
    name = canonicalize_name(name)
    return name in TORCH_STACK or name.startswith("nvidia-")


@dataclass(frozen=True)
class Spec:
    """One validated package spec."""

    text: str  # as typed, stripped
    name: str  # canonical distribution name
    extras: tuple[str, ...] = ()
    specifier: str = ""
    url: str = ""  # direct reference (name @ url)
    local: str = ""  # absolute local path (wheel, sdist or project folder)

    @property
    def pip_arg(self) -> str:
        """The one argument given to pip for this spec."""
        if self.local:
            return self.local
        extras = f"[{','.join(self.extras)}]" if self.extras else ""
        if self.url:
            return f"{self.name}{extras} @ {self.url}"
        return f"{self.name}{extras}{self.specifier}"


def _looks_local(text: str) -> bool:
    return (
        text.startswith((".", "/", "~"))
        or (os.sep in text and not any(c.isspace() for c in text))
        or text.lower().endswith(ARCHIVES)
        or text.startswith("file:")
    )


def _local_name(path: str) -> str:
    base = os.path.basename(path.rstrip("/"))
    try:
        if base.endswith(".whl"):
            return parse_wheel_filename(base)[0]
        if base.endswith((".tar.gz", ".zip")):
            return parse_sdist_filename(base)[0]
    except (InvalidWheelFilename, InvalidSdistFilename) as e:
        raise SpecError(f"{base!r} is not a wheel or sdist file name: {e}") from e
    pyproject = os.path.join(path, "pyproject.toml")
    if os.path.isfile(pyproject):
        import tomllib

        with open(pyproject, "rb") as f:
            name = tomllib.load(f).get("project", {}).get("name")
        if name:
            return canonicalize_name(name)
    raise SpecError(
        f"Cannot tell which distribution {path!r} holds: give a wheel or sdist file, "
        "or a project folder whose pyproject.toml names it."
    )


def _not_a_requirement(text: str) -> str:
    """Why ``text`` (one word as the magic received it) is refused, in the user's words."""
    shown = text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 1] + "…"
    if _ONE_OPTION.fullmatch(text):
        return (
            f"`{shown}` is a pip option, not a package: %gpu_install takes package names "
            "like `six` or `six==1.17.0`, one per word, and options of its own before them "
            "(unquoted; %gpu_install? lists them)."
        )
    return (
        f"`{shown}` is not a package requirement: %gpu_install takes package names like "
        "`six` or `six==1.17.0`, one per word"
        + (" (it runs no shell commands)." if _SHELL.search(text) else ".")
    )


def parse_spec(text: str, allow_url: bool = False, allow_local: bool = False) -> Spec:
    """Validate one spec; raise SpecError with a message for the user."""
    text = text.strip()
    if not text:
        raise SpecError("An empty package spec was given.")
    if _CONTROL.search(text):
        raise SpecError(f"The spec {text!r} contains control characters.")
    if text.startswith("-") or _OPTION.search(text):
        raise SpecError(_not_a_requirement(text))
    direct = _DIRECT.match(text) is not None
    if not direct and "://" in text and not text.startswith("file:"):
        raise SpecError(f"{text!r} is a bare URL: write it as NAME @ URL (and pass --allow-url).")
    if not direct and _looks_local(text):
        if not allow_local:
            raise SpecError(
                f"{text!r} is a local path: pass --allow-local to install from local files."
            )
        path = os.path.abspath(os.path.expanduser(text.removeprefix("file://")))
        if not os.path.exists(path):
            raise SpecError(f"The local path {path!r} does not exist.")
        return Spec(text=text, name=_local_name(path), local=path)
    try:
        req = Requirement(text)
    except InvalidRequirement as e:
        raise SpecError(_not_a_requirement(text)) from e
    if req.marker is not None:
        raise SpecError(f"{text!r}: environment markers are not supported by %gpu_install.")
    name = canonicalize_name(req.name)
    extras = tuple(sorted(canonicalize_name(e) for e in req.extras))
    if req.url:
        scheme = urlsplit(req.url).scheme.lower()
        if scheme == "file":
            if not allow_local:
                raise SpecError(f"{text!r} points to a local file: pass --allow-local.")
            return Spec(text=text, name=name, extras=extras, url=req.url)
        if scheme not in URL_SCHEMES:
            raise SpecError(f"{text!r}: URL scheme {scheme!r} is not supported.")
        if not allow_url:
            raise SpecError(f"{text!r} installs from a URL: pass --allow-url to allow it.")
        if _CONTROL.search(req.url) or " " in req.url:
            raise SpecError(f"{text!r}: the URL contains spaces or control characters.")
        return Spec(text=text, name=name, extras=extras, url=req.url)
    return Spec(text=text, name=name, extras=extras, specifier=str(req.specifier))


def check_url(value: str, option: str, allow_path: bool = False) -> str:
    """An index or find-links location given as an option."""
    value = value.strip()
    if not value or value.startswith("-") or _CONTROL.search(value) or " " in value:
        raise SpecError(f"{option}: {value!r} is not a valid location.")
    scheme = urlsplit(value).scheme.lower()
    if scheme in ("https", "http"):
        return value
    if allow_path and (scheme in ("", "file")):
        path = os.path.abspath(os.path.expanduser(value.removeprefix("file://")))
        if not os.path.exists(path):
            raise SpecError(f"{option}: the folder {path!r} does not exist.")
        return path
    where = "an http(s) URL or a folder" if allow_path else "an http(s) URL"
    raise SpecError(f"{option}: {value!r} must be {where}.")


def check_host(host: str) -> str:
    """--trusted-host: a host name or address, optionally with a port."""
    if not managed_block.host_ok(host):
        raise SpecError(f"--trusted-host: {host[:80]!r} is not a host name (like example.org).")
    return host


def check_module(name: str) -> str:
    if not _MODULE.fullmatch(name):
        raise SpecError(f"--import: {name!r} is not a Python module name.")
    return name


def check_apt(name: str) -> str:
    if not managed_block.APT_PACKAGE.fullmatch(name):
        raise SpecError(f"--apt: {name!r} is not a Debian package name.")
    return name


def check_code(code: str) -> str:
    """--check: one line of Python (statements separated by ';')."""
    if _CONTROL.search(code.replace("\t", " ")):
        raise SpecError(
            "--check: the code must be one line without control characters "
            "(separate statements with ';')."
        )
    if len(code) > MAX_CHECK:
        raise SpecError(f"--check: the code is longer than {MAX_CHECK} characters.")
    return code
