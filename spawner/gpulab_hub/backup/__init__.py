"""``gpulab backup`` and ``gpulab restore``: one archive of a hub's state (docs/backup.md).

The archive is a ``.tar.gz`` with these members:

- ``gpulab-backup.json`` (the manifest, first): the gpulab version that wrote it, when,
  what is in it; small (at most MAX_MANIFEST bytes, on both sides);
- ``gpulab-members.jsonl`` (last): one line for every member, in the archive's order
  (its name, kind, sha256 and size), and for every entry left out; written and read as
  a stream, one line (at most MAX_LINE bytes) at a time, so no number of files a user
  keeps makes it too large to restore. Format 1 (older gpulab) had the member list in
  the manifest, last; restore still reads it;
- ``hub/``: the hub's folder (``<GPULAB_HOME>/hub``): the JupyterHub database (a
  consistent copy taken with SQLite's online backup API while the hub runs), the cookie
  secret, the key of users' secrets and the secrets still encrypted, the SSH host key
  and users' public keys, sharing records, GPU records, projects' image records. Each
  record file is read under its store's lock. Left out: logs, PID and lock files, the
  wheels gpulab rebuilds, and (unless ``--projects``) deleted users' archives;
- ``projects/``: every project's Dockerfile; with ``--projects`` every project folder;
- ``config.d/``: the admin's ``<GPULAB_HOME>/jupyterhub_config.d/*.py``.

Project folders (and deleted users' archives) are the users' own: every entry there is
hostile. They are read one folder at a time from descriptors, never through a link: a
link is stored as a link (its target as text, never what it points to), FIFOs, sockets
and devices are left out. Names are kept exactly (any bytes Linux allows, as Python's
surrogate escapes), files with holes are stored sparse (``sparse.py``), and each project
is held to the admin's limits (GPULAB_BACKUP_PROJECT_FILES, GPULAB_BACKUP_PROJECT_MB).
``make.py`` writes archives, ``restore.py`` reads them, ``tree.py`` walks folders into
one, ``unpack.py`` writes members below a folder from descriptors.
"""

from __future__ import annotations

from gpulab_hub.layout import DATABASE as DATABASE  # the hub's database (gpulab's tables too)

FORMAT = 2  # the archive's layout; a newer layout is refused by an older gpulab
MANIFEST = "gpulab-backup.json"
MEMBERS = "gpulab-members.jsonl"  # format 2: the member list, one JSON object a line
# What backup writes and restore reads, one bound for both sides: the manifest (format 2
# keeps no list in it) and one line of the member list (a name 64 folders deep, each
# name 255 bytes none of them UTF-8, escaped, is under 100 KiB).
MAX_MANIFEST = 16 << 20
MAX_LINE = 256 << 10
HUB, PROJECTS, CONFIG_D = "hub", "projects", "config.d"  # the archive's top folders


class BackupError(Exception):
    """A backup or restore that cannot go on; ``str()`` says why and what to do."""


def version() -> str:
    """This gpulab's version (the gpulab-hub distribution's)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("gpulab-hub")
    except PackageNotFoundError:
        return "0"
