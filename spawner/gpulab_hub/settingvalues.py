"""How one site variable is read: the parsers of one ``GPULAB_*`` value's text.

Each parser takes the variable's name and its text, and returns the value (a number,
a flag, a tuple of names, a checked URL or address) or raises :class:`SettingError`,
a sentence naming the variable and what it may be. :func:`var` declares a field of
the settings (settings.py) read from one variable with one of these parsers.

Nothing here imports gpulab: it sits at the bottom of the house. The settings read
it, and so do the parts that check a value as its variable is checked (stacks.py a
package index URL, ssh/web.py a host name).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import field
from typing import Any
from urllib.parse import urlsplit

_HOSTNAME = re.compile(r"(?=.{1,253}\Z)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")  # fmt: skip


class SettingError(ValueError):
    """A site variable's value is not allowed; the sentence names it and what it may be."""


def text(name: str, value: str) -> str:
    return value


def flag(name: str, value: str) -> bool:
    if value not in ("0", "1"):
        raise SettingError(f"{name} must be 1 (on) or 0 (off); it is {value!r}.")
    return value == "1"


def whole(low: int, high: int, unit: str = "a whole number") -> Callable[[str, str], int]:
    """A whole number from ``low`` to ``high``, digits only."""

    def parse(name: str, value: str) -> int:
        if not re.fullmatch(r"[0-9]{1,9}", value) or not low <= int(value) <= high:
            raise SettingError(f"{name} must be {unit} from {low} to {high}; it is {value!r}.")
        return int(value)

    return parse


def optional(parse: Callable[[str, str], Any]) -> Callable[[str, str], Any]:
    """``parse``, or None where the variable is empty: the trait's own default then."""

    def read(name: str, value: str) -> Any:
        return parse(name, value) if value else None

    return read


def choice(*allowed: str) -> Callable[[str, str], str]:
    def parse(name: str, value: str) -> str:
        if value not in allowed:
            words = " or ".join(repr(a) for a in allowed)
            raise SettingError(f"{name} must be {words}; it is {value!r}.")
        return value

    return parse


# A package index URL as it may stand unquoted in a Dockerfile's RUN line (projects/stacks).
INDEX_URL = re.compile(r"https?://[A-Za-z0-9.-]+(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~/%+@:-]*)?")


def index_url(name: str, value: str) -> str:
    if not INDEX_URL.fullmatch(value):
        raise SettingError(
            f"{name} must be an http or https URL (letters, digits and -._~/:%+@ only); "
            f"it is {value[:80]!r}."
        )
    return value


_NAMES = re.compile(r"[a-z0-9][a-z0-9-]{0,39}(?:,[a-z0-9][a-z0-9-]{0,39}){0,31}")


def names_or_all(name: str, value: str) -> tuple[str, ...] | None:
    """``all`` (None: every one), ``none`` (()) or names with commas, no spaces."""
    if value == "all":
        return None
    if value == "none":
        return ()
    if not _NAMES.fullmatch(value):
        raise SettingError(
            f"{name} must be all, none or names with commas (pytorch,minimal); it is {value!r}."
        )
    return tuple(value.split(","))


def host_or_empty(name: str, value: str) -> str:
    """An IP address or a host name, whole; "" where unset."""
    if value and not valid_host(value):
        raise SettingError(f"{name} must be an IP address or a host name; it is {value!r}.")
    return value


def is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        return False


def valid_host(value: str) -> bool:
    """An IP address or a host name, whole."""
    return is_ip(value) or _HOSTNAME.fullmatch(value) is not None


def var(name: str, default: Any, parse: Callable[[str, str], Any] = text, *, secret=False):
    """A field read from the environment variable ``name``; empty or unset: ``default``.
    ``secret``: never handed to a service (settings.service_env)."""
    return field(default=default, metadata={"var": name, "parse": parse, "secret": secret})


PORT = whole(1, 65535, "a port number")
SECONDS = whole(0, 999_999_999, "a whole number of seconds")


def names(name: str, value: str) -> tuple[str, ...]:
    """A comma-separated list of names (spaces around each are dropped)."""
    return tuple(n.strip() for n in value.split(",") if n.strip())


def dns(name: str, value: str) -> tuple[str, ...]:
    """LDAP DNs separated by semicolons (a DN holds commas)."""
    return tuple(n.strip() for n in value.split(";") if n.strip())


def url_or_empty(name: str, value: str) -> str:
    """An http(s) URL with a host, whole; "" where unset."""
    if value and (urlsplit(value).scheme not in ("http", "https") or not urlsplit(value).hostname):
        raise SettingError(f"{name} must be an https:// URL; it is {value!r}.")
    return value


DATABASE_BACKENDS = {"sqlite": ("", "pysqlite"), "postgresql": ("", "psycopg", "psycopg2")}


def database_url(name: str, value: str) -> str:
    """The hub's database as SQLAlchemy names it: SQLite (``sqlite:///<file>``) or
    PostgreSQL (``postgresql+psycopg://user:password@host/db``, or its socket:
    ``postgresql+psycopg://user@/db?host=/run/postgresql``); "" where unset."""
    if not value:
        return value
    import sqlalchemy as sa

    try:
        url = sa.make_url(value)
    except sa.exc.ArgumentError:
        raise SettingError(
            f"{name} is not a database URL (like postgresql+psycopg://gpulab@db/gpulab)."
        ) from None
    drivers = DATABASE_BACKENDS.get(url.get_backend_name())
    if drivers is None or (url.drivername.partition("+")[2] not in drivers):
        raise SettingError(
            f"{name} names a database gpulab does not run on ({url.drivername}): use "
            "sqlite:///<file> or postgresql+psycopg://..."
        )
    return value


def networks(name: str, value: str) -> tuple[str, ...]:
    """Comma-separated IPv4 and IPv6 networks (``10.0.0.0/8``) or addresses; ``lan``
    stands for every private and link-local range (LAN_NETWORKS), ``none`` for none."""
    found: list[str] = []
    for item in names(name, value):
        if item.lower() == "none":
            continue
        if item.lower() == "lan":
            found += LAN_NETWORKS
            continue
        try:
            found.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise SettingError(
                f"{name} must be networks such as 10.0.0.0/8 or 192.168.1.20, comma-separated "
                f"(or lan, or none); {item!r} is not one."
            ) from None
    return tuple(dict.fromkeys(found))


# The LAN: private IPv4 ranges, carrier-grade NAT, link-local, unique-local and
# link-local IPv6 (what GPULAB_REFUSED_NETWORKS=lan stands for, its default).
LAN_NETWORKS = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
                "169.254.0.0/16", "fc00::/7", "fe80::/10")  # fmt: skip
