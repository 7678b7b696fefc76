"""What a secret may be called and hold: checked whole, with the reason in the refusal.

A secret reaches a project's processes as an environment variable of its name, so a
name the system, Python, CUDA, Jupyter or gpulab reads would change how things run
there (``PATH``, ``LD_PRELOAD``, ``PYTHONPATH``, ``CUDA_VISIBLE_DEVICES``,
``JUPYTERHUB_API_TOKEN``…): such names are refused, the reason named. Names are
capital letters, digits and underscores, as environment variables are written.
"""

from __future__ import annotations

import re

NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,63}")
MAX_VALUE_BYTES = 16 * 1024
MAX_SECRETS = 50
NAME_RULE = (
    "A secret's name is 1 to 64 capital letters, digits and underscores, not starting "
    "with a digit (like HF_TOKEN or WANDB_API_KEY)."
)

# Families of names, by their start: who reads them.
RESERVED_PREFIXES = {
    "LD_": "the system's program loader reads it",
    "DYLD_": "the program loader reads it",
    "PYTHON": "Python reads it at start",
    "PIP_": "pip reads it (%gpu_install would install differently than the Dockerfile)",
    "CONDA_": "conda reads it",
    "JUPYTER": "Jupyter and JupyterHub read it",
    "JPY_": "Jupyter reads it",
    "IPYTHON": "IPython reads it",
    "GPULAB_": "gpulab uses it",
    "NVIDIA_": "the NVIDIA container runtime and driver read it",
    "CUDA_": "CUDA reads it (which GPUs a program sees, how it runs)",
    "NCCL_": "NCCL reads it (how GPUs talk in multi-GPU jobs)",
    "TORCH_": "PyTorch reads it",
    "LC_": "it sets the language and formats of every program",
    "BASH_": "bash reads it",
    "XDG_": "desktop and cache folders are read from it",
    "SSH_": "SSH sessions use it",
}
# Single names, and who reads them.
RESERVED_NAMES = {
    **dict.fromkeys(
        ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "PWD", "OLDPWD", "HOSTNAME", "MAIL"),
        "the system and every shell use it",
    ),
    **dict.fromkeys(
        ("TERM", "COLUMNS", "LINES", "IFS", "ENV", "CDPATH", "PS1", "PS2", "PS4", "_"),
        "shells and terminals read it",
    ),
    "PROMPT_COMMAND": "shells run it",
    **dict.fromkeys(("LANG", "LANGUAGE", "TZ"), "it sets the language or time of every program"),
    **dict.fromkeys(("TMPDIR", "TMP", "TEMP"), "programs put temporary files where it says"),
    "VIRTUAL_ENV": "it names the project's Python environment",
    **dict.fromkeys(
        ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"),
        "it says which certificate authorities are trusted",
    ),
    **dict.fromkeys(
        ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "FTP_PROXY"),
        "it sends the project's network traffic through a proxy",
    ),
    **dict.fromkeys(
        ("HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_CACHE"),
        "it moves or switches off the project's Hugging Face cache",
    ),
    **dict.fromkeys(
        ("OMP_NUM_THREADS", "MAX_JOBS", "FORCE_CUDA", "ACCELERATE_MIXED_PRECISION"),
        "gpulab sets it for builds and jobs",
    ),
}


class SecretRefused(ValueError):
    """A name or value that cannot be stored; ``str()`` says why and what to do."""


def reserved_because(name: str) -> str:
    """Why ``name`` would change how things run in a project; "" if it would not."""
    if name in RESERVED_NAMES:
        return RESERVED_NAMES[name]
    for prefix, why in RESERVED_PREFIXES.items():
        if name.startswith(prefix):
            return why
    return ""


def check_name(name: str) -> str:
    """``name`` if a secret may be called so (surrounding spaces dropped), else
    SecretRefused with the reason."""
    name = name.strip() if isinstance(name, str) else ""
    if not name:
        raise SecretRefused("Give the secret a name. " + NAME_RULE)
    if not NAME.fullmatch(name):
        shown = name[:70].encode("ascii", "replace").decode()
        raise SecretRefused(f"{shown!r} cannot name a secret. " + NAME_RULE)
    why = reserved_because(name)
    if why:
        raise SecretRefused(
            f"{name} cannot name a secret: {why}, so a secret of that name would change how "
            "things run in your projects. Choose another name (for example MY_" + name.strip("_")
            + ")."
        )  # fmt: skip
    return name


def check_value(value: str) -> str:
    """The value to store (surrounding whitespace, which a paste often adds, dropped),
    else SecretRefused. Never quoted back: a refusal says what is wrong, not the value."""
    value = value.strip() if isinstance(value, str) else ""
    if not value:
        raise SecretRefused("Enter the secret's value.")
    if "\0" in value:
        raise SecretRefused("The value holds a NUL character, which no environment variable can.")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise SecretRefused("The value is not valid text (UTF-8).") from None
    if size > MAX_VALUE_BYTES:
        raise SecretRefused(f"The value is longer than {MAX_VALUE_BYTES // 1024} KiB.")
    return value
