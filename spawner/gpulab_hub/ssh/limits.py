"""How often the SSH gateway lets a client fail to log in before it turns it away.

Two counts, each over a sliding window:

- per account: failed passwords (hub tokens) for one gpulab account. Past the limit,
  that account's password logins are refused for the lockout period, even with the
  right token. Its key logins still work: a key cannot be guessed, and otherwise
  anyone could lock any user out by failing on purpose;
- per address: failed passwords, and connections that tried to log in (a key, a
  password, a malformed login name) and never did, from one IP address. Past the
  limit, every login from that address is refused for the lockout period.

The numbers come from the hub's settings (:meth:`Limits.of`). The per-account ones
are the hub's own login rules (``GPULAB_LOGIN_ATTEMPTS``, 0 for never,
``GPULAB_LOGIN_LOCKOUT_SECONDS``), so a token is no easier to guess over SSH than a
password on the login page.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from gpulab_hub.settings import DEFAULT, Settings

# Keys tracked at most (each a few hundred bytes): a flood of addresses cannot grow the
# gateway's memory without bound; the oldest are forgotten first.
MAX_TRACKED = 50_000


@dataclass(frozen=True)
class Limits:
    # failed passwords of one account within window_s (0: accounts are never locked)
    user_failures: int = DEFAULT.accounts.login_attempts
    ip_failures: int = DEFAULT.ssh.ip_attempts  # failed logins from one address in window_s
    window_s: float = float(DEFAULT.ssh.failure_window_s)
    lockout_s: float = float(DEFAULT.accounts.login_lockout_s)

    @classmethod
    def of(cls, s: Settings) -> Limits:
        """The limits the settings give: the hub's own login rules
        (``GPULAB_LOGIN_ATTEMPTS``, ``GPULAB_LOGIN_LOCKOUT_SECONDS``) and the address
        lockout (``GPULAB_SSH_IP_ATTEMPTS``, ``GPULAB_SSH_FAILURE_WINDOW``)."""
        return cls(
            user_failures=s.accounts.login_attempts,
            ip_failures=s.ssh.ip_attempts,
            window_s=float(s.ssh.failure_window_s),
            lockout_s=float(s.accounts.login_lockout_s),
        )


def lockout_message(seconds: float) -> str:
    """What a locked-out client is told."""
    minutes = max(1, math.ceil(seconds / 60))
    return (
        "Too many failed logins: gpulab's SSH gateway refuses them for a while. "
        f"Try again in {minutes} minute{'s' if minutes != 1 else ''}."
    )


class Limiter:
    """Failure counts and locks in memory (one gateway process; a restart forgets them)."""

    def __init__(self, limits: Limits, clock: Callable[[], float] = time.monotonic):
        self.limits = limits
        self._clock = clock
        self._failures: dict[tuple[str, str], deque[float]] = {}
        self._locked_until: dict[tuple[str, str], float] = {}

    def _left(self, key: tuple[str, str]) -> float:
        until = self._locked_until.get(key)
        if until is None:
            return 0.0
        left = until - self._clock()
        if left <= 0:
            del self._locked_until[key]
            return 0.0
        return left

    def address_locked(self, ip: str) -> float:
        """Seconds until logins from ``ip`` are taken again (0: they are now)."""
        return self._left(("ip", ip))

    def password_locked(self, ip: str, user: str) -> float:
        """Seconds until a password login of ``user`` from ``ip`` is taken again."""
        return max(self._left(("ip", ip)), self._left(("user", user)))

    def _count(self, key: tuple[str, str], limit: int) -> None:
        if limit <= 0:  # never locked (GPULAB_LOGIN_ATTEMPTS=0, as on the login page)
            return
        now = self._clock()
        times = self._failures.pop(key, None) or deque()
        self._failures[key] = times  # newest last: the oldest keys are forgotten first
        times.append(now)
        while times and times[0] <= now - self.limits.window_s:
            times.popleft()
        while len(times) > limit:
            times.popleft()
        if len(times) >= limit:
            self._locked_until[key] = now + self.limits.lockout_s
            times.clear()
        self._forget_oldest()

    def _forget_oldest(self) -> None:
        for table in (self._failures, self._locked_until):
            while len(table) > MAX_TRACKED:
                del table[next(iter(table))]

    def password_failed(self, ip: str, user: str | None) -> None:
        """A wrong password (hub token): counts for the address and the account."""
        self._count(("ip", ip), self.limits.ip_failures)
        if user:
            self._count(("user", user), self.limits.user_failures)

    def login_failed(self, ip: str) -> None:
        """A connection tried to log in and never did (passwords are counted apart)."""
        self._count(("ip", ip), self.limits.ip_failures)

    def password_succeeded(self, user: str) -> None:
        """The account's earlier failed passwords no longer count."""
        self._failures.pop(("user", user), None)
