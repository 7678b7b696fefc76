"""The SSH login names of projects: what a user types before ``@host``.

- ``<user>+<project>``: the user's own project;
- ``<user>+<owner>~<project>``: someone else's project shared with the user.

``<user>`` is the gpulab account that logs in (its keys or hub token must match);
a bare ``<user>`` (no project: what people type first) logs in only to be told
these forms and their own projects' names (gateway.py, :func:`parse_account`);
``~`` is in no account or project name. An owner whose name holds ``+`` cannot be
named in the second form (the split would be ambiguous); their own logins work.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Account names (accounts.USERNAME_PATTERN) and project names (projects/rename.NAME).
_USER = r"[a-z0-9][a-z0-9._@+-]{0,63}"
_OWNER = r"[a-z0-9][a-z0-9._@-]{0,63}"
_PROJECT = r"[a-z][a-z0-9]{0,29}(?:-[a-z0-9]+)*"
ACCOUNT = re.compile(_USER)
LOGIN = re.compile(rf"(?P<user>{_USER})\+(?:(?P<owner>{_OWNER})~)?(?P<project>{_PROJECT})")
MAX_LOGIN = 200


@dataclass(frozen=True)
class Login:
    user: str  # who logs in
    owner: str  # whose project
    project: str

    @property
    def own(self) -> bool:
        return self.user == self.owner


def parse_login(name: str) -> Login | None:
    """The login ``name`` as (user, owner, project); None unless it is one whole,
    well-formed login name."""
    if not isinstance(name, str) or len(name) > MAX_LOGIN:
        return None
    m = LOGIN.fullmatch(name)
    if m is None:
        return None
    user, project = m["user"], m["project"]
    return Login(user, m["owner"] or user, project)


def login_name(user: str, owner: str, project: str) -> str:
    """What ``user`` types to reach ``owner``'s ``project``."""
    return f"{user}+{project}" if user == owner else f"{user}+{owner}~{project}"


def parse_account(name: str) -> str | None:
    """``name`` if it is one whole account name with no project (``alice``), else None.
    A name that parses as a login name (``alice+one``) is a login, not an account."""
    if not isinstance(name, str) or len(name) > MAX_LOGIN or parse_login(name) is not None:
        return None
    return name if ACCOUNT.fullmatch(name) else None


def choose_project(user: str, port: int, projects: list[str]) -> str:
    """What a bare ``user`` login is told: the login name to type, their own projects."""
    own = ", ".join(projects) if projects else "none yet: create one on gpulab's home page"
    return (
        f"gpulab: name the project: ssh -p {port} {user}+<project>@<host> "
        f"(your projects: {own}). For a project shared with you: "
        f"{user}+<owner>~<project>."
    )
