"""Your secrets in a gpulab project: ``get("HF_TOKEN")``.

You keep named secrets on gpulab's hub (its Secrets page) and choose which projects
get them. A kernel, terminal or job gets them as environment variables when it
starts, so ``os.environ["HF_TOKEN"]`` works too, and Hugging Face's libraries read
``HF_TOKEN`` by themselves. :func:`get` says what to do when one is missing.

Nothing happens at import time; this module only reads the environment.
"""

from __future__ import annotations

import os

# What gpulab adds beside the secrets (names only, never values).
NAMES_VAR = "GPULAB_SECRET_NAMES"  # "HF_TOKEN,WANDB_API_KEY": the secrets this process got
PROBLEM_VAR = "GPULAB_SECRETS_PROBLEM"  # why it got none, where the hub could not be asked
STARTED_BY_VAR = "GPULAB_STARTED_BY"  # who started the kernel, terminal or job

_MISSING = object()


class MissingSecret(LookupError):
    """A secret this kernel did not get; ``str()`` says why and what to do."""


def _given(environ) -> frozenset[str] | None:
    """The names of the secrets this process got; None where gpulab gave none at all."""
    if NAMES_VAR not in environ:
        return None
    return frozenset(n for n in environ[NAMES_VAR].split(",") if n)


def names() -> list[str]:
    """The names of the secrets this kernel (terminal, job) got when it started."""
    return sorted(_given(os.environ) or ())


def secrets_page(environ) -> str:
    """Where the hub's Secrets page is, as the user reaches it."""
    public = environ.get("JUPYTERHUB_PUBLIC_HUB_URL", "")
    if public:
        return public.rstrip("/") + "/gpulab/secrets"
    base = environ.get("JUPYTERHUB_BASE_URL", "/")
    return base.rstrip("/") + "/hub/gpulab/secrets"


def why_missing(name: str, environ) -> str:
    """What to tell someone whose process did not get secret ``name``."""
    given = _given(environ)
    project = environ.get("JUPYTERHUB_SERVER_NAME", "")
    owner = environ.get("JUPYTERHUB_USER", "")
    page = secrets_page(environ)
    if given is not None and name in given:
        return (
            f"{name} was given to this kernel, but code running in it has removed it from "
            "os.environ: restart the kernel to get it again."
        )
    if given is None:
        problem = environ.get(PROBLEM_VAR, "")
        if problem:
            return (
                f"{name}: this kernel started without your secrets ({problem}). Restart the "
                "kernel to ask gpulab's hub again."
            )
        if not project:
            return f"{name} is not set, and this kernel does not run in a gpulab project."
    starter = environ.get(STARTED_BY_VAR, "")
    if starter and owner and starter != owner:
        return (
            f"{name} is not one of the secrets this kernel got: kernels that collaborators "
            f"start get {owner}'s secrets only where {owner} allows it for project "
            f"{project} on the Secrets page ({page}). Ask {owner}, then restart the kernel."
        )
    return (
        f"{name} is not one of the secrets this kernel got: add it on the Secrets page "
        f"({page}), choose it for project {project}, then restart the kernel."
    )


def get(name: str, default=_MISSING) -> str:
    """The value of secret ``name`` as this kernel got it; ``default`` if given and the
    secret is missing, else MissingSecret saying what to do."""
    environ = os.environ
    given = _given(environ)
    value = environ.get(name)
    if value is not None and (given is None or name in given):
        return value
    if default is not _MISSING:
        return default
    raise MissingSecret(why_missing(name, environ))
