"""``gpulab backup`` and ``gpulab restore``: one archive of a hub's state (docs/backup.md).

The archive is a ``.tar.gz`` with these members:

- ``gpulab-backup.json`` (the manifest, last): the gpulab version that wrote it, when, what
  is in it, and the sha256 and size of every file member;
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
and devices are left out. ``make.py`` writes archives, ``restore.py`` reads them,
``tree.py`` walks folders into one.
"""

from __future__ import annotations

FORMAT = 1  # the archive's layout; a newer layout is refused by an older gpulab
MANIFEST = "gpulab-backup.json"
HUB, PROJECTS, CONFIG_D = "hub", "projects", "config.d"  # the archive's top folders
DATABASE = "jupyterhub.sqlite"


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
