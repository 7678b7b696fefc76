"""The RUN line recorded for one verified package: pinned, self-verifying, and with
the build environment it was compiled with."""

from __future__ import annotations

import json
import shlex

from . import verify


def _direct_reference(name: str) -> str:
    """``URL@commit`` (VCS) or the URL an installed distribution came from."""
    dist = verify._distribution(name)
    data = json.loads((dist.read_text("direct_url.json") if dist else None) or "{}")
    url, vcs = data.get("url", ""), data.get("vcs_info")
    if vcs and vcs.get("commit_id"):
        return f"{vcs['vcs']}+{url}@{vcs['commit_id']}"
    return url


def run_line(spec, version, opts, env, no_isolation, modules) -> str:
    """The pinned, self-verifying RUN line recorded for one package."""
    extras = f"[{','.join(spec.extras)}]" if spec.extras else ""
    remote = spec.url and not spec.url.startswith("file:")  # a build cannot see local files
    url = _direct_reference(spec.name) if remote else ""
    req = f"{spec.name}{extras} @ {url}" if url else f"{spec.name}{extras}=={version}"
    cmd = ["python", "-m", "pip", "install", "--no-cache-dir"]
    cmd += ["--no-build-isolation"] if no_isolation else []
    cmd += [*opts.recorded_options(spec.name), req]
    words = [f"{k}={shlex.quote(v)}" for k, v in env.items()] + [shlex.quote(c) for c in cmd]
    line = "RUN " + " ".join(words)
    if modules:
        line += " && python -c " + shlex.quote("import " + ", ".join(modules))
    return line
