"""How long access accepted through a share link lasts.

JupyterHub 6.1's share codes (links) expire, but a share made by accepting one
does not (``orm.Share`` has no expiry): without gpulab, "a link valid for 1 h"
would give access until someone revokes it. So each link says how long the
access it gives lasts, chosen on the Share page:

- ``link`` (the default): access ends when the link expires (or when its owner
  revokes the link);
- ``revoked``: access lasts until the owner revokes it (JupyterHub's own way).

gpulab records, in the hub's folder (``link-access.json``), the links made to
last until revoked, and for each person who accepted a ``link`` link the scopes
that link gave them and when they end. JupyterHub 6.1 accepts a link on its accept
page only (``POST /hub/accept-share``: its REST API has no acceptance), whose route
gpulab's own handler takes (accept.py), accepting through :func:`accept_async`:
JupyterHub's ``ShareCode.exchange``, then the record, written on the records pool;
the hub then takes away, every ``GPULAB_REVOKE_WITHIN_S``/2
seconds, the scopes whose time is up (``orm.Share.revoke``), and the project
server ends the person's access within ``GPULAB_REVOKE_WITHIN_S`` as for any
revoke. Scopes a person already held otherwise (shared by name, or through a link
lasting until revoked) are never taken away by a link's end; sharing by name
makes a person's access last until revoked; a share deleted and made again is
not touched by what was recorded of the old one.

A damaged record fails closed. gpulab can then no longer tell which access ends with
a link, so the record it starts again holds one ``lost:`` entry: the next sweep ends
every share made before the damage was found (the owners share again by name; a link
still valid can be accepted again). The same holds for a record that goes missing
while the hub runs (the hub makes it at its first sweep). Links made to last until
revoked were lost with the record: their access now ends with the link, never later.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from jupyterhub import orm
from jupyterhub.utils import utcnow
from sqlalchemy import event, inspect
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from tornado.web import HTTPError

from gpulab_hub import blocking, jsonfile, stateversion

FILE_NAME = "link-access.json"  # in the hub's records folder
LINK, REVOKED = "link", "revoked"
LOST = "lost:"  # a record damaged (or gone) at that time: every share made before ends
# The choices on the Share page, in the owner's words; the first is the default.
LASTS = {LINK: "access ends when the link expires", REVOKED: "access lasts until I revoke it"}
DEFAULT_LASTS = LINK
LOG = logging.getLogger("gpulab.linkaccess")


def iso(when: datetime | None) -> str:
    """A naive UTC datetime of JupyterHub's database, as gpulab records it."""
    return when.replace(tzinfo=None).isoformat() if when else ""


def _at(text: str) -> datetime:
    """A recorded time, naive UTC (as JupyterHub's database keeps times)."""
    return datetime.fromisoformat(text).replace(tzinfo=None)


def code_key(code: orm.ShareCode) -> str:
    """One link, for good: its id and when it was made (ids may be used again)."""
    return f"code:{code.owner.name}/{code.spawner.name}:{code.id}:{iso(code.created_at)}"


def grant_key(owner: str, project: str, kind: str, name: str) -> str:
    return f"grant:{owner}/{project}:{kind}:{name}"


def _target_of(share) -> tuple[str, str]:
    return ("group", share.group.name) if share.group is not None else ("user", share.user.name)


@dataclass(frozen=True)
class Accepted:
    """An acceptance of a link, in plain values (read from the database on the loop)."""

    owner: str
    project: str
    kind: str  # "user" or "group"
    name: str
    share_created: str  # iso()
    code_key: str
    expires_at: datetime  # naive UTC
    given: frozenset[str]  # the link's scopes the share now holds
    before: frozenset[str]  # the share's scopes before

    @classmethod
    def of(cls, code: orm.ShareCode, share: orm.Share, before: set[str]) -> Accepted:
        kind, name = _target_of(share)
        return cls(
            owner=code.owner.name,
            project=code.spawner.name,
            kind=kind,
            name=name,
            share_created=iso(share.created_at),
            code_key=code_key(code),
            expires_at=code.expires_at.replace(tzinfo=None),
            given=frozenset(set(code.scopes) & set(share.scopes)),
            before=frozenset(before),
        )


class LinkAccess(jsonfile.LockedRecord):
    """``link-access.json``: ``code:…`` entries (links lasting until revoked) and
    ``grant:…`` entries (scopes a person holds until a link's end)."""

    kind = stateversion.KINDS["link-access"]
    section = "links"
    what = "The link access record"
    on_damage = (
        "gpulab can no longer tell which access ends with a link, so every share made "
        "before now ends within GPULAB_REVOKE_WITHIN_S (owners share again on the project's "
        "Share page; a link still valid can be accepted again), and links made to last until "
        "revoked end when they expire"
    )

    def _parse(self, section) -> dict:
        section = super()._parse(section)
        for key, rec in section.items():
            if key.startswith("code:"):
                if rec.get("lasts") != REVOKED or not isinstance(rec.get("id"), int):
                    raise ValueError(f"{key} does not say how long its access lasts")
            elif key.startswith("grant:"):
                texts = [rec.get(k) for k in ("owner", "project", "kind", "name", "share_created")]
                if not all(isinstance(t, str) for t in texts):
                    raise TypeError(f"{key} lacks whose access it is")
                scopes = rec.get("scopes")
                if not isinstance(scopes, dict) or not all(
                    isinstance(v, dict) and isinstance(v.get("until"), str) for v in scopes.values()
                ):
                    raise TypeError(f"{key} does not say when its scopes end")
                for v in scopes.values():
                    datetime.fromisoformat(v["until"])  # ValueError if not a time
            elif key.startswith(LOST):
                if not isinstance(rec.get("at"), str):
                    raise TypeError(f"{key} does not say when the record was lost")
                datetime.fromisoformat(rec["at"])  # ValueError if not a time
            else:
                raise ValueError(f"{key!r} is not a record gpulab makes")
        return section

    def _recover(self) -> dict:
        """What a damaged record is replaced with: every share made until now ends."""
        at = iso(utcnow(with_tz=False))
        return {f"{LOST}{at}": {"at": at}}

    def _missing(self) -> dict:
        """No record: a first start, or (once the hub made it) a record that is gone."""
        if _Hub.made is None or Path(_Hub.made) != self.path:
            return {}
        records = self._recover()
        self._write(records)
        self.log.error(
            "%s %s is missing though the hub made it; gpulab started a new one: %s.",
            self.what, self.path, self.on_damage,
        )  # fmt: skip
        return records

    def ensure(self) -> None:
        """Make the record if there is none yet (blocking: blocking.run(RECORDS, ...))."""
        with self.locked():
            if not self.path.exists():
                self._write(self._read())

    # --- the whole record, for pages (read off the event loop, used on it) ----------
    def snapshot(self) -> dict:
        """Every record as it is now (blocking: blocking.run(RECORDS, ...))."""
        with self.locked():
            return self._read()

    def apply(self, before: dict, changes: dict[str, dict | None]) -> None:
        """Write ``changes`` (key -> new record, None: gone) made from the snapshot
        ``before``; a key changed by someone else since is left as they made it."""
        with self.locked():
            records = self._read()
            after = dict(records)
            for key, rec in changes.items():
                if records.get(key) != before.get(key):
                    continue
                if rec is None:
                    after.pop(key, None)
                else:
                    after[key] = rec
            if after != records:
                self._write(after)

    # --- links --------------------------------------------------------------------
    def mark(self, code: orm.ShareCode, lasts: str) -> None:
        """Record how long access through the new link ``code`` lasts."""
        self.mark_key(code_key(code), code.id, lasts)

    def mark_key(self, key: str, code_id: int, lasts: str) -> None:
        """:meth:`mark` of the link ``key`` (:func:`code_key`), number ``code_id``:
        plain values, so it runs off the event loop (the database stays on it)."""
        if lasts not in LASTS:
            raise ValueError(f"Choose how long access lasts: {', '.join(LASTS)}.")
        if lasts == DEFAULT_LASTS:
            return
        with self.locked():
            records = self._read()
            records[key] = {"lasts": lasts, "id": code_id}
            self._write(records)

    # --- people -------------------------------------------------------------------
    def accepted(self, code: orm.ShareCode, share: orm.Share, before: set[str]) -> None:
        """``share`` was just granted by accepting ``code``; ``before``: its scopes
        before (its share's, if it existed). Blocking (the database read here)."""
        self.accepted_plain(Accepted.of(code, share, before))

    def accepted_plain(self, a: Accepted) -> None:
        """:meth:`accepted` from plain values (:meth:`Accepted.of`, read on the event
        loop), so that it runs on the records pool."""
        key = grant_key(a.owner, a.project, a.kind, a.name)
        with self.locked():
            records = self._read()
            lasts = lasts_in(records, a.code_key)
            rec = records.get(key)
            if rec is not None and rec["share_created"] != a.share_created:
                rec = None  # of a share that was deleted since
            bound = dict(rec["scopes"]) if rec else {}
            ends = {"until": iso(a.expires_at), "code": a.code_key}
            for scope in sorted(a.given):
                if lasts == REVOKED:
                    bound.pop(scope, None)  # held until revoked now
                elif scope in bound:
                    if _at(bound[scope]["until"]) < a.expires_at:
                        bound[scope] = ends
                elif scope not in a.before:
                    bound[scope] = ends
            if bound:
                records[key] = {
                    "owner": a.owner,
                    "project": a.project,
                    "kind": a.kind,
                    "name": a.name,
                    "share_created": a.share_created,
                    "scopes": bound,
                }
            else:
                records.pop(key, None)
            self._write(records)

    def lasts_until_revoked(self, owner: str, project: str, kind: str, name: str) -> None:
        """The owner shared with this person or group by name: nothing of theirs ends
        with a link any more."""
        with self.locked():
            records = self._read()
            if records.pop(grant_key(owner, project, kind, name), None) is not None:
                self._write(records)

    def ends(self, owner: str, project: str, kind: str, name: str) -> str:
        """When the access of ``kind`` ``name`` to the project ends (ISO, naive UTC):
        the last end of its link-bound scopes; "" when it lasts until revoked."""
        return ends_in(self.snapshot(), owner, project, kind, name)

    def end_link(self, db, key: str) -> int:
        """The link ``key`` (:func:`code_key`) is revoked: the access it gave ends now.
        How many people (or groups) lost some access."""
        self.end_link_records(key)
        return self.sweep(db)

    async def end_link_async(self, db, key: str) -> int:
        """:meth:`end_link` for the hub's pages: the record off the event loop, the
        database on it."""
        await blocking.run(blocking.RECORDS, self.end_link_records, key)
        return await self.sweep_async(db)

    def end_link_records(self, key: str) -> None:
        """The record's half of :meth:`end_link` (no database)."""
        now = utcnow(with_tz=False)
        with self.locked():
            records = self._read()
            for rec in records.values():
                for bound in (rec.get("scopes") or {}).values():
                    if bound.get("code") == key:
                        bound["until"] = iso(min(_at(bound["until"]), now))
            records.pop(key, None)
            self._write(records)

    def sweep(self, db, now: datetime | None = None) -> int:
        """Take away every scope whose link has ended; forget records of shares that are
        gone. How many people (or groups) lost some access."""
        with self.locked():
            records = self._read()
            changes, ended = self._sweep_plan(db, records, now)
            if changes:
                self.apply(records, changes)
        return ended

    async def sweep_async(self, db, now: datetime | None = None) -> int:
        """:meth:`sweep` on the hub's event loop: the record read and written on the
        records pool, the database (and its revokes) here."""
        records = await blocking.run(blocking.RECORDS, self.snapshot)
        changes, ended = self._sweep_plan(db, records, now)
        if changes:
            await blocking.run(blocking.RECORDS, self.apply, records, changes)
        return ended

    def _sweep_plan(self, db, records: dict, now: datetime | None) -> tuple[dict, int]:
        """Revoke (in the database) what has ended; the record's changes, and how many
        people (or groups) lost some access."""
        now = now or utcnow(with_tz=False)
        ended = 0
        kept = {}
        for key, rec in records.items():
            if key.startswith(LOST):
                ended += self._end_all(db, _at(rec["at"]))
                continue
            if key.startswith("code:"):
                code = db.get(orm.ShareCode, rec["id"])
                if code is not None and code_key(code) == key:
                    kept[key] = rec
                continue
            share, target = self._share(db, rec)
            if share is None or iso(share.created_at) != rec["share_created"]:
                continue
            over = sorted(s for s, v in rec["scopes"].items() if _at(v["until"]) <= now)
            if over:
                orm.Share.revoke(db, share.spawner, target, scopes=over)
                LOG.info(
                    "gpulab: the link-bound access of %s %s to %s/%s ended (%s)",
                    rec["kind"], rec["name"], rec["owner"], rec["project"], ", ".join(over),
                )  # fmt: skip
                ended += 1
            left = {s: v for s, v in rec["scopes"].items() if s not in over}
            if left:
                kept[key] = {**rec, "scopes": left}
        changes = {k: kept.get(k) for k in records if kept.get(k) != records[k]}
        return changes, ended

    def _end_all(self, db, until: datetime) -> int:
        """The record was lost at ``until``: end every share made by then (which of them
        a link bounded is not known any more). How many shares ended."""
        gone = [
            s
            for s in db.query(orm.Share)
            if s.created_at is None or s.created_at.replace(tzinfo=None) <= until
        ]
        names = []
        for share in gone:
            kind, name = _target_of(share)
            names.append(f"{kind} {name} on {share.owner.name}/{share.spawner.name}")
            db.delete(share)
        db.commit()
        self.log.error(
            "gpulab: %s was lost at %s UTC, so gpulab cannot tell which access ends with a "
            "link: it ended all %d shares made before (%s). Owners share again on the "
            "project's Share page.",
            self.named, iso(until), len(names), "; ".join(names) or "none",
        )  # fmt: skip
        return len(names)

    @staticmethod
    def _share(db, rec: dict):
        owner = orm.User.find(db, rec["owner"])
        spawner = owner.orm_spawners.get(rec["project"]) if owner is not None else None
        if spawner is None:
            return None, None
        find = orm.User.find if rec["kind"] == "user" else orm.Group.find
        target = find(db, rec["name"])
        if target is None:
            return None, None
        return orm.Share.find(db, spawner, target), target


def lasts_in(records: dict, key: str) -> str:
    """How long access through the link ``key`` lasts, from a :meth:`snapshot`."""
    rec = records.get(key)
    return rec["lasts"] if rec else DEFAULT_LASTS


def ends_in(records: dict, owner: str, project: str, kind: str, name: str) -> str:
    """:meth:`LinkAccess.ends`, from a :meth:`LinkAccess.snapshot`."""
    rec = records.get(grant_key(owner, project, kind, name))
    if not rec or not rec["scopes"]:
        return ""
    return iso(max(_at(v["until"]) for v in rec["scopes"].values()))


class _Hub:
    """The hub process's record and sweeper (see :func:`install`)."""

    store: LinkAccess | None = None
    made: Path | None = None  # the record this hub made (or found) at its first sweep
    every_s: float = 15.0
    sweeper = None
    listening = False  # the sweeper starts after the hub's first commit


def store_in(hub_dir: str | Path) -> LinkAccess:
    return LinkAccess(Path(hub_dir) / FILE_NAME)


def _take_back(db, spawner, share_with, share, before: set[str]) -> None:
    """Never let a link give access for longer than it says: what it gave, taken back."""
    added = sorted(set(share.scopes) - before)
    if added:
        orm.Share.revoke(db, spawner, share_with, scopes=added)


def accept(code: orm.ShareCode, share_with) -> orm.Share:
    """Accept the link ``code`` for ``share_with`` (a user or a group): JupyterHub's own
    ``ShareCode.exchange``, and the record of when the access it gives ends. Blocking
    (the record's lock); the hub's accept page awaits :func:`accept_async` instead."""
    db = inspect(code).session
    old = orm.Share.find(db, code.spawner, share_with)
    before = set(old.scopes) if old is not None else set()
    share = code.exchange(share_with)
    if _Hub.store is not None:
        try:
            _Hub.store.accepted(code, share, before)
        except (jsonfile.RecordError, blocking.Busy, OSError):
            _take_back(db, code.spawner, share_with, share, before)
            LOG.exception("gpulab: could not record how long a link's access lasts")
            raise
    return share


async def accept_async(code: orm.ShareCode, share_with) -> orm.Share:
    """:func:`accept` for the hub's accept page: the database on the event loop, the
    record on the records pool (its lock never held on the loop). If the record cannot
    be written the access is taken back and the person told why (blocking.Busy: 503,
    in words; a record that cannot be read: 503 with what to do)."""
    db = inspect(code).session
    spawner = code.spawner
    old = orm.Share.find(db, spawner, share_with)
    before = set(old.scopes) if old is not None else set()
    share = code.exchange(share_with)
    if _Hub.store is None:
        return share
    try:
        await blocking.run(
            blocking.RECORDS, _Hub.store.accepted_plain, Accepted.of(code, share, before)
        )
    except (jsonfile.RecordError, blocking.Busy, OSError) as e:
        _take_back(db, spawner, share_with, share, before)
        LOG.error("gpulab: could not record how long a link's access lasts: %s", e)
        if isinstance(e, blocking.Busy):
            raise
        raise HTTPError(503, "%s", f"The link was not accepted: {e} Then accept it again.") from e
    return share


async def _sweep_now() -> None:
    from jupyterhub.app import JupyterHub

    if _Hub.store is None or not JupyterHub.initialized():
        return
    db = JupyterHub.instance().db
    try:
        if _Hub.made != _Hub.store.path:
            await blocking.run(blocking.RECORDS, _Hub.store.ensure)
            _Hub.made = _Hub.store.path
        await _Hub.store.sweep_async(db)
    except (jsonfile.RecordError, blocking.Busy) as e:
        LOG.error("Link-bound access not ended: %s", e)
    except (SQLAlchemyError, OSError):  # a periodic callback: log, sweep again next time
        db.rollback()
        LOG.exception("Link-bound access not ended; trying again")


def _start_sweeping(_session) -> None:
    """After the hub's first commit on its event loop: sweep every ``every_s``."""
    if _Hub.sweeper is not None:
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    from tornado.ioloop import IOLoop, PeriodicCallback

    _Hub.sweeper = PeriodicCallback(_sweep_now, _Hub.every_s * 1000)
    _Hub.sweeper.start()
    IOLoop.current().add_callback(_sweep_now)


def install(hub_dir: str | Path, revoke_within_s: int) -> None:
    """In the hub's process (settings.py): record acceptances of links, and end
    link-bound access within ``revoke_within_s`` of its link's end (the hub sweeps
    every half of it; project servers take the other half)."""
    _Hub.store = store_in(hub_dir)
    _Hub.made = None
    if _Hub.sweeper is not None:  # a hub configured again in this process (tests)
        _Hub.sweeper.stop()
        _Hub.sweeper = None
    _Hub.every_s = max(1.0, revoke_within_s / 2)
    if not _Hub.listening:
        _Hub.listening = True
        event.listen(Session, "after_commit", _start_sweeping)


def hub_store() -> LinkAccess | None:
    """The hub's record (None outside a hub that installed it)."""
    return _Hub.store
