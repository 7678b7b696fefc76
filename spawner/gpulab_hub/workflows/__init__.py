"""Workflows: what an owner or an admin does to a whole project or account, across
every capability that keeps something of it.

- rename.py: a stopped project takes a new name, with its server, folders and every
  per-project record (records.py lists them);
- deletion.py: a deleted project or account leaves nothing a later one of the same
  name could inherit.

They sit above the capabilities they call (docs/architecture.md): nothing below
imports them; the spawner, the authenticator and the pages do.
"""

from __future__ import annotations

from pathlib import Path

TEMPLATES = Path(__file__).with_name("templates")  # the rename page
