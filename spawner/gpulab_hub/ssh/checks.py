"""What the SSH gateway takes from a client and from the hub's answers.

Everything an SSH client sends (terminal type, window sizes, environment requests,
forward targets, subsystem names, commands) is untrusted: each is checked against an
allow-list with a full match and bounds, and what fails is dropped or refused. The
hub's access answer is checked too before a container is named to Docker.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# --- from the client ---------------------------------------------------------------

TERM = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
DEFAULT_TERM = "xterm-256color"
# Environment requests passed on (OpenSSH's client sends LANG and LC_* by default).
ENV_NAMES = re.compile(r"LANG|LANGUAGE|LC_[A-Z]{2,14}|COLORTERM")
ENV_VALUE = re.compile(r"[A-Za-z0-9_.:@-]{1,64}")
MAX_ENV = 16
MAX_COLUMNS = 1000
MAX_ROWS = 1000
MAX_COMMAND = 64 * 1024  # characters of an exec request's command
SUBSYSTEMS = ("sftp",)
FORWARD_HOSTS = {"localhost": "127.0.0.1", "127.0.0.1": "127.0.0.1", "::1": "::1"}
# A socket path in the container: absolute, plain characters, no "." or ".." part,
# short enough for sun_path (108 bytes with its end).
_PART = r"/(?!\.\.?(?:/|\Z))[A-Za-z0-9._@+-]{1,64}"
SOCKET_PATH = re.compile(rf"(?:{_PART}){{1,16}}")
MAX_SOCKET_PATH = 107


def terminal_type(term: str | None) -> str:
    """The client's TERM if it is a plain terminal name, else DEFAULT_TERM."""
    if isinstance(term, str) and TERM.fullmatch(term):
        return term
    return DEFAULT_TERM


def window_size(width, height) -> tuple[int, int] | None:
    """(columns, rows) within bounds, or None where the client sent none (0) or junk."""
    if not isinstance(width, int) or not isinstance(height, int):
        return None
    if width <= 0 or height <= 0:
        return None
    return min(width, MAX_COLUMNS), min(height, MAX_ROWS)


def client_env(env: Mapping) -> dict[str, str]:
    """The client's environment requests that are passed on: locale names only."""
    taken: dict[str, str] = {}
    for name, value in env.items():
        if len(taken) >= MAX_ENV:
            break
        if isinstance(name, bytes):
            name = name.decode("ascii", "replace")
        if isinstance(value, bytes):
            value = value.decode("ascii", "replace")
        if not isinstance(name, str) or not isinstance(value, str):
            continue
        if ENV_NAMES.fullmatch(name) and ENV_VALUE.fullmatch(value):
            taken[name] = value
    return taken


def command_ok(command) -> bool:
    """An exec request's command is text of at most MAX_COMMAND characters, no NUL."""
    return isinstance(command, str) and 0 < len(command) <= MAX_COMMAND and "\0" not in command


def forward_target(host, port) -> tuple[str, int] | None:
    """(address, port) in the container for a ``-L`` forward to ``host:port``; only the
    container's own loopback (localhost, 127.0.0.1, ::1). None: refused."""
    if not isinstance(host, str) or not isinstance(port, int) or isinstance(port, bool):
        return None
    address = FORWARD_HOSTS.get(host)
    if address is None or not 1 <= port <= 65535:
        return None
    return address, port


def socket_path(path) -> str | None:
    """A Unix socket path in the container for a streamlocal forward, or None."""
    if not isinstance(path, str) or len(path) > MAX_SOCKET_PATH:
        return None
    return path if SOCKET_PATH.fullmatch(path) else None


# --- from the hub --------------------------------------------------------------------

RUN_ROLES = ("owner", "collaborator")
CONTAINER = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,254}")
EXEC_USER = re.compile(r"([0-9]{1,9}):([0-9]{1,9})")
WORKDIR = SOCKET_PATH
SECRET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
MAX_SECRET_VALUE = 64 * 1024
MAX_SECRETS = 200
# Not C0/C1 controls (escape sequences), nor bidirectional overrides.
_UNPRINTABLE = re.compile(r"[^\x20-\x7e\u00a0-\uffff\n]|[\u202a-\u202e\u2066-\u2069]")


def plain_text(text, limit: int = 1000) -> str:
    """Words for a client's terminal: no control characters (no escape sequences)."""
    if not isinstance(text, str):
        return ""
    return _UNPRINTABLE.sub(" ", text)[:limit].strip()


def exec_user(value) -> str | None:
    """The hub's ``uid:gid`` for sessions, never root's; None if it is not one."""
    if not isinstance(value, str):
        return None
    m = EXEC_USER.fullmatch(value)
    if m is None or int(m[1]) == 0 or int(m[2]) == 0:
        return None
    return f"{int(m[1])}:{int(m[2])}"


def workdir(value) -> str:
    if isinstance(value, str) and WORKDIR.fullmatch(value):
        return value
    return "/workspace"


def secrets_env(answer) -> dict[str, str]:
    """The ``env`` of the hub's secrets answer, names and values checked (bad ones
    dropped: a secret is never passed half-checked)."""
    env = answer.get("env") if isinstance(answer, dict) else None
    if not isinstance(env, dict):
        return {}
    taken = {}
    for name, value in list(env.items())[:MAX_SECRETS]:
        if (
            isinstance(name, str)
            and SECRET_NAME.fullmatch(name)
            and isinstance(value, str)
            and len(value) <= MAX_SECRET_VALUE
            and "\0" not in value
        ):
            taken[name] = value
    return taken


@dataclass(frozen=True)
class Decision:
    """What the gateway does with a session after asking the hub."""

    action: str  # "go" (container is running), "start", "wait" (it is starting), "refuse"
    message: str = ""
    container: str = ""
    exec_user: str = ""
    workdir: str = "/workspace"


def not_yours(owner: str, project: str) -> str:
    return (
        f"gpulab: there is no project {project} of {owner} that you may open a shell in. "
        "Check the name, or ask its owner to share it with you as a collaborator."
    )


def decide(access, owner: str, project: str) -> Decision:
    """The gateway's next step from the hub's access answer (``access`` API)."""
    if not isinstance(access, dict):
        return Decision("refuse", "gpulab: the hub gave no answer about this project; try again.")
    message = plain_text(access.get("message"))
    role = access.get("role")
    if role not in RUN_ROLES:
        if role == "viewer":
            return Decision(
                "refuse",
                message
                or f"gpulab: you may view {owner}'s project {project} but not run code in it, "
                "so SSH into it is not open to you. Ask its owner for the collaborator role.",
            )
        return Decision("refuse", message or not_yours(owner, project))
    if access.get("running") and access.get("container"):
        container = access["container"]
        user = exec_user(access.get("exec_user"))
        if not isinstance(container, str) or not CONTAINER.fullmatch(container) or user is None:
            return Decision("refuse", "gpulab: the hub's answer about this project is not usable.")
        return Decision("go", message, container, user, workdir(access.get("workdir")))
    if access.get("pending"):
        return Decision("wait", message)
    if access.get("can_start"):
        return Decision("start", message)
    url = plain_text(access.get("url"), 300)
    words = message or f"gpulab: project {project} of {owner} is not running."
    if url and url not in words:
        words += f" Start it at {url}"
    return Decision("refuse", words)
