"""Each user's secrets, kept encrypted on the hub (see docs/secrets.md)."""

from __future__ import annotations


def configure(c, s: dict[str, str], hub_dir) -> None:
    """The secrets pages, the API project servers ask, the encryption key (filled in)."""
