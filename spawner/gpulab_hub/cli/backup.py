"""``gpulab backup`` and ``gpulab restore`` (the work is in gpulab_hub.backup; docs/backup.md).

This module reads where the hub lives (the site's settings and the hub's configuration)
and hands the paths to gpulab_hub.backup, which reads no settings itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpulab_hub import hubsettings
from gpulab_hub.backup import BackupError


def _home(environ) -> tuple[Path, Path]:
    """(GPULAB_HOME, the hub's own folder) as the site's settings give them."""
    from gpulab_hub import settings

    s = settings.parse(environ)
    return Path(s.home), Path(s.hub_dir)


def limits_of(s):
    """What one project may put in a backup (tree.Limits), from the settings ``s``."""
    from gpulab_hub.backup.tree import Limits

    return Limits(
        files=s.backup.project_files, bytes=s.backup.project_mb << 20,
        files_name="GPULAB_BACKUP_PROJECT_FILES", bytes_name="GPULAB_BACKUP_PROJECT_MB",
    )  # fmt: skip


def cmd_backup(args, environ) -> int:
    from gpulab_hub import settings
    from gpulab_hub.backup import make

    try:
        home, hub_dir = _home(environ)
        limits = limits_of(settings.parse(environ))
        make.require_hub(home, hub_dir)
        try:
            config = hubsettings.read_config(hubsettings.config_file())
            where = hubsettings.from_config(config)
        except Exception as e:  # noqa: BLE001 - the admin's Python: say what failed
            raise BackupError(
                f"Could not read the hub's configuration ({type(e).__name__}: {e})."
            ) from e
        make.make(
            args.output, home=home, hub_dir=hub_dir, config=config, where=where,
            projects=args.projects, environ=environ, limits=limits,
        )  # fmt: skip
    except (BackupError, ValueError) as e:
        print(f"gpulab backup: {e}", file=sys.stderr)
        return 1
    return 0


def running_hub(hub_dir: Path) -> str:
    """A sentence naming the hub that runs on ``hub_dir`` ("" when none): the one
    `gpulab up` started (its PID file), or one JupyterHub's own PID file names."""
    from gpulab_hub import pidfile
    from gpulab_hub.cli import hub_process

    me, _ = hub_process(hub_dir)
    if me is not None:
        return me.describe()
    try:
        pid = int((hub_dir / "jupyterhub.pid").read_text(errors="replace").strip()[:20])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return ""
    if b"jupyterhub" in cmdline:
        who = pidfile.identity(pid)
        return who.describe() if who else f"process {pid}"
    return ""


def cmd_restore(args, environ) -> int:
    from gpulab_hub.backup import restore

    try:
        home, hub_dir = _home(environ)
        # Project folders go where a hub on this GPULAB_HOME keeps them by default.
        projects_root = hubsettings.default_layout(home).projects_root
        restore.restore(
            Path(args.archive), home=home, hub_dir=hub_dir, projects_root=projects_root,
            force=args.force, running=running_hub(hub_dir), environ=environ,
        )  # fmt: skip
    except (BackupError, ValueError) as e:
        print(f"gpulab restore: {e}", file=sys.stderr)
        return 1
    return 0


def add_parsers(sub) -> None:
    b = sub.add_parser(
        "backup",
        help="write one archive of the hub's state while it runs (database, records, "
        "encrypted secrets, keys, project Dockerfiles)",
    )
    b.add_argument(
        "--projects", action="store_true", help="also every file of every project folder"
    )
    b.add_argument(
        "-o", "--output", metavar="FILE", type=Path,
        help="the archive to write (default: gpulab-backup-<time>.tar.gz here)",
    )  # fmt: skip
    b.set_defaults(fn=cmd_backup)
    r = sub.add_parser("restore", help="bring a hub's state back from a `gpulab backup` archive")
    r.add_argument("archive", metavar="FILE", help="the archive gpulab backup wrote")
    r.add_argument(
        "--force", action="store_true",
        help="restore over a GPULAB_HOME that has a hub already (what is there is moved aside)",
    )  # fmt: skip
    r.set_defaults(fn=cmd_restore)
