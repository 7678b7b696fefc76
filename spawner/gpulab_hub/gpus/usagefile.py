"""The GPU usage ledger file of gpulab before its database, and its import.

gpulab kept ended GPU holdings in an append-only file, one JSON object a line
(``ProjectSpawner.usage_file``, gpu-usage.jsonl beside the allocation record). At the
upgrade that makes the table ``gpulab_usage`` (db/migrate.py), :class:`LedgerImport`
reads the whole file, line by line (each line bounded), and adds every record to the
table in the upgrade's own transaction, with a row in ``gpulab_imports`` saying so; once
that transaction committed, the file is renamed ``<name>.imported`` and kept beside
it, the pre-upgrade backup. A crash between the two leaves the file under its name and
the import recorded: the next start renames it without importing it twice.

A torn or damaged line is skipped and counted (the import's sentence says how many); a
line of a newer format ends the upgrade with the sentence of stateversion.NewerState,
the file left as it is and nothing imported. The file is never followed through a link.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa

from gpulab_hub import jsonfile, stateversion
from gpulab_hub.db import engine as db_engine
from gpulab_hub.db import migrate, tables
from gpulab_hub.gpus import usage

KIND = stateversion.KINDS["gpu-usage"]  # the lines' format (stateversion.py)
MAX_LINE = 2048  # bytes of one record, newline included
IMPORT = "gpu-usage"  # its name in gpulab_imports
IMPORTED = ".imported"  # the file's suffix once imported
BATCH = 1000  # rows a statement


class Read:
    """The records of a ledger file, read line by line; ``skipped``: the damaged or torn
    lines met so far."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.skipped = 0

    def __iter__(self) -> Iterator[usage.Record]:
        fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise usage.UsageError(f"The GPU usage ledger {self.path} is not a regular file.")
            while line := f.readline(MAX_LINE + 1):
                if not line.endswith(b"\n"):
                    if len(line) > MAX_LINE:  # too long to be a record: skip to its end
                        while (rest := f.readline(MAX_LINE + 1)) and not rest.endswith(b"\n"):
                            pass
                    self.skipped += 1  # (or a write cut short by a crash, at the end)
                    continue
                record = self._record(line)
                if record is not None:
                    yield record

    def _record(self, line: bytes) -> usage.Record | None:
        if not line.strip():
            return None
        try:
            d = json.loads(line)
            if isinstance(d, dict):  # lines of format 1 carry no "version"
                d = KIND.upgrade(d, self.path)
                d.pop("version", None)
            return usage.Record(**d)
        except stateversion.NewerState:
            raise
        except (ValueError, TypeError, usage.UsageError):
            self.skipped += 1
            return None


def records(path: str | Path) -> list[usage.Record]:
    """Every record of the ledger file ``path`` (damaged lines skipped)."""
    return list(Read(path))


class LedgerImport:
    """The import of the ledger file ``path`` into gpulab_usage (a migrate.Import)."""

    def __init__(self, path: str | Path, clock=time.time, log=None):
        self.path = Path(path)
        self._clock = clock
        self.log = log or jsonfile.LOG
        self._rename = False

    def pending(self) -> bool:
        return os.path.lexists(self.path)

    def run(self, conn: sa.Connection) -> str:
        done = conn.execute(
            sa.select(tables.imports.c.rows).where(tables.imports.c.name == IMPORT)
        ).scalar()
        kept = self._kept_as()
        self._rename = True
        if done is not None:
            return (
                f"The GPU usage ledger {self.path} was imported before ({done} records); it "
                f"is kept as {kept}."
            )
        read = Read(self.path)
        n = 0
        batch: list[dict] = []
        try:
            for record in read:
                batch.append(usage.row_of(record))
                if len(batch) >= BATCH:
                    conn.execute(usage.insert(), batch)
                    n, batch = n + len(batch), []
        except stateversion.NewerState as e:
            self._rename = False
            raise db_engine.DatabaseError(str(e)) from None
        except (OSError, usage.UsageError) as e:
            self._rename = False
            raise db_engine.DatabaseError(
                f"The GPU usage ledger {self.path} cannot be imported: {e}"
            ) from None
        if batch:
            conn.execute(usage.insert(), batch)
            n += len(batch)
        conn.execute(
            tables.imports.insert(),
            {"name": IMPORT, "source": str(self.path), "rows": n, "skipped": read.skipped,
             "at": self._clock()},
        )  # fmt: skip
        skipped = f" ({read.skipped} damaged or torn line(s) skipped)" if read.skipped else ""
        return (
            f"Imported {n} GPU usage record(s) from {self.path} into the table "
            f"{tables.usage.name}{skipped}; the file is kept as {kept}, the pre-upgrade backup."
        )

    def _kept_as(self) -> Path:
        return migrate.kept_name(self.path, IMPORTED)

    def finish(self) -> None:
        if not self._rename or not os.path.lexists(self.path):
            return
        dest = migrate.keep(self.path, IMPORTED)
        self.log.info("gpulab: the GPU usage ledger %s is kept as %s", self.path, dest)
