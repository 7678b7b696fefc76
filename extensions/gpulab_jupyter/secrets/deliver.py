"""How a project server hands a person's secrets to the processes that person starts.

One container serves a project's owner and collaborators, so secrets are never in the
server's own environment. When someone starts a kernel (``POST /api/kernels``,
``POST /api/sessions``, a session's ``PATCH`` that changes its kernel) or restarts one
(``POST /api/kernels/<id>/restart``), a terminal
(``POST /api/terminals``) or a job (the jobs API), gpulab's authorizer, once it has
allowed the request, asks the hub for that person's secrets for this project with
the person's own token (:class:`SecretsClient`) and puts the answer in
:data:`current`. The request's handler runs in the same asyncio task, so the kernel
manager (kernels.py), the terminal manager (terminals.py) and the jobs handler read
it there and add it to the new process's environment only.

A person's answer is kept :data:`CACHE_S` seconds at most. When the hub cannot be
asked, the process starts all the same, without secrets, and the log and
``GPULAB_SECRETS_PROBLEM`` say why. No value is ever logged.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import quote

from gpulab_jupyter.secrets import NAMES_VAR, PROBLEM_VAR, STARTED_BY_VAR

CACHE_S = 3.0
TIMEOUT_S = 10.0
MAX_ANSWER_BYTES = 2 * 1024 * 1024
NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,63}")  # the hub's rule (gpulab_hub.secrets.names)

# Requests that start a process: (handler class, HTTP method, last part of the path or
# "" for any). A handler may also say so itself: ``gpulab_starts_process()`` (the jobs
# API's start and re-run).
STARTS = frozenset(
    {
        ("jupyter_server.services.kernels.handlers.MainKernelHandler", "POST", ""),
        ("jupyter_server.services.kernels.handlers.KernelActionHandler", "POST", "restart"),
        ("jupyter_server.services.sessions.handlers.SessionRootHandler", "POST", ""),
        ("jupyter_server.services.sessions.handlers.SessionHandler", "PATCH", ""),
        ("jupyter_server_terminals.api_handlers.TerminalRootHandler", "POST", ""),
    }
)


@dataclass(frozen=True)
class Delivery:
    """What one person's new process gets: their secrets for this project (``env``),
    or none and why (``problem``)."""

    person: str
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    problem: str = ""

    def __repr__(self) -> str:  # names only, never values (logs, tracebacks)
        return f"Delivery({self.person!r}, names={sorted(self.env)}, problem={self.problem!r})"

    def additions(self) -> dict[str, str]:
        """The variables to add to the new process's environment."""
        if self.problem:
            return {PROBLEM_VAR: self.problem, STARTED_BY_VAR: self.person}
        return {**self.env, NAMES_VAR: ",".join(sorted(self.env)), STARTED_BY_VAR: self.person}


# The delivery for the request being handled (set by the authorizer, in its task).
current: contextvars.ContextVar[Delivery | None] = contextvars.ContextVar(
    "gpulab_secrets_delivery", default=None
)


def with_secrets(base: Mapping[str, str], delivery: Delivery | None) -> dict[str, str]:
    """``base`` (an environment) plus what ``delivery`` gives; ``base`` if None."""
    env = dict(base)
    if delivery is not None:
        for stale in (NAMES_VAR, PROBLEM_VAR, STARTED_BY_VAR):
            env.pop(stale, None)
        env.update(delivery.additions())
    return env


def starts_process(handler) -> bool:
    """Whether ``handler``'s request starts a kernel, terminal or job."""
    own = getattr(handler, "gpulab_starts_process", None)
    if callable(own):
        return bool(own())
    method = handler.request.method
    last = (getattr(handler, "path_args", None) or [""])[-1]
    for cls in type(handler).__mro__:
        name = f"{cls.__module__}.{cls.__qualname__}"
        if (name, method, "") in STARTS or (name, method, last) in STARTS:
            return True
    return False


def parse_answer(body: bytes) -> dict[str, str]:
    """The hub's ``{"env": {NAME: value}}``; ValueError for anything else."""
    if len(body) > MAX_ANSWER_BYTES:
        raise ValueError("the answer is too large")
    answer = json.loads(body)
    env = answer.get("env") if isinstance(answer, dict) else None
    if not isinstance(env, dict):
        raise ValueError("the answer has no env")
    for name, value in env.items():
        if not (isinstance(name, str) and NAME.fullmatch(name) and isinstance(value, str)):
            raise ValueError("the answer names a variable gpulab does not give")
        if "\0" in value:
            raise ValueError("a value holds a NUL character")
    return env


class SecretsClient:
    """Asks the hub for a person's secrets for this project, with their token."""

    def __init__(self, api_url: str, owner: str, project: str, log):
        self.url = (
            f"{api_url.rstrip('/')}/gpulab/secrets/{quote(owner, safe='')}/"
            f"{quote(project, safe='')}"
        )
        self.log = log
        self._cache: dict[str, tuple[float, Delivery]] = {}

    async def delivery_for(self, token: str, person: str) -> Delivery:
        """``person``'s delivery, asked with ``token`` (their own), or one that says
        why there is none."""
        key = hashlib.sha256(f"{person}\0{token}".encode("utf-8", "replace")).hexdigest()
        now = time.monotonic()
        self._cache = {k: v for k, v in self._cache.items() if now - v[0] < CACHE_S}
        if key in self._cache:
            return self._cache[key][1]
        delivery = await self._ask(token, person)
        if not delivery.problem:
            self._cache[key] = (time.monotonic(), delivery)
        return delivery

    async def _ask(self, token: str, person: str) -> Delivery:
        from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

        if not token:
            return self._without(person, "the request that started it carried no token")
        request = HTTPRequest(
            self.url,
            headers={"Authorization": f"token {token}"},
            request_timeout=TIMEOUT_S,
            connect_timeout=TIMEOUT_S,
            follow_redirects=False,
        )
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except (TimeoutError, HTTPClientError, OSError) as e:
            return self._without(person, f"gpulab's hub did not answer ({type(e).__name__})")
        if response.code != 200:
            answer = f"gpulab's hub answered {response.code}: {_message(response)}"
            return self._without(person, answer)
        try:
            env = parse_answer(response.body or b"")
        except ValueError as e:  # json.JSONDecodeError included
            return self._without(person, f"gpulab's hub gave an answer gpulab cannot use ({e})")
        names = ", ".join(sorted(env)) or "-"
        self.log.info("gpulab: %s's new process gets the secrets %s", person, names)
        return Delivery(person, env)

    def _without(self, person: str, why: str) -> Delivery:
        self.log.warning("gpulab: %s's new process starts without secrets: %s", person, why)
        return Delivery(person, {}, why)


def _message(response) -> str:
    """The hub's error message (one line, short), never anything else of the answer."""
    try:
        message = json.loads(response.body or b"{}").get("message", "")
    except (ValueError, AttributeError):
        message = ""
    return " ".join(str(message or response.reason or "").split())[:200]
