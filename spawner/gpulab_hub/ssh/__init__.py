"""SSH into projects: a gateway the hub starts as a service (see docs/remote.md)."""

from __future__ import annotations


def configure(c, s: dict[str, str], hub_dir) -> None:
    """The gateway service, its role, its pages and settings (filled in by ssh/)."""
