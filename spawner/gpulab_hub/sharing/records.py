"""The sharing records of a project, as rename and delete see them (records.py).

Four stores name a project: its sharing settings (policy.py, in the hub's database),
and in the hub's records folder its public links (public.py), how long access accepted
through its links lasts (linkaccess.py) and the roles mirroring its group shares
(groupshares.py).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from jupyterhub import orm
from jupyterhub import roles as hub_roles

from gpulab_hub import blocking, hubsettings, records
from gpulab_hub.db import tables
from gpulab_hub.sharing import groupshares, linkaccess
from gpulab_hub.sharing.policy import SharingPolicyStore
from gpulab_hub.sharing.public import PublicLinkStore


def _key(owner: str, project: str) -> str:
    return f"{owner}/{project}"


class SharingPolicyRecords(records.ByServerRow):
    """The owner's sharing settings: rows of the hub's database naming the server row."""

    what = "sharing settings"
    store = SharingPolicyStore
    table = tables.sharing_settings

class PublicLinkRecords(records.Records):
    """The project's public notebook links (their codes stay the same on a rename)."""

    what = "public links"
    store = PublicLinkStore

    def _store(self) -> PublicLinkStore:
        return PublicLinkStore(Path(self.where.records_dir) / hubsettings.PUBLIC_LINKS)

    def move(self, owner: str, old: str, new: str) -> records.Undo | None:
        links = self._store()
        with links.locked():
            current = links._read()
            mine = [x for x in current if (x.owner, x.project) == (owner, old)]
            stale = [x for x in current if (x.owner, x.project) == (owner, new)]
            if not mine and not stale:
                return None
            moved_ids = {x.id for x in mine}
            kept = [x for x in current if (x.owner, x.project) not in ((owner, old), (owner, new))]
            links._write([*kept, *(replace(x, project=new) for x in mine)])

        def undo() -> None:
            with links.locked():
                now = links._read()
                back = [replace(x, project=old) for x in now if x.id in moved_ids]
                others = [x for x in now if x.id not in moved_ids]
                links._write([*others, *back, *stale])

        return undo

    def holds(self, owner: str, project: str) -> bool:
        links = self._store()
        with links.locked():
            return any((x.owner, x.project) == (owner, project) for x in links._read())

    def forget(self, owner: str, project: str) -> None:
        self._store().forget(owner, project)

    def forget_owner(self, owner: str) -> None:
        self._store().forget_owner(owner)


def _project_of(key: str) -> tuple[str, str]:
    """(owner, project) a link-access key names: ``code:<owner>/<project>:…`` or
    ``grant:<owner>/<project>:…`` (neither name holds ":" or "/"); none for the mark of
    a lost record (``lost:<time>``), which is every project's."""
    if key.startswith(linkaccess.LOST):
        return "", ""
    owner, _, project = key.split(":", 2)[1].partition("/")
    return owner, project


def _renamed(key: str, rec: dict, owner: str, old: str, new: str) -> tuple[str, dict]:
    """A link-access entry of ``owner/old`` as one of ``owner/new``: its key, the
    project it names, the server its scopes name, and the links they came from."""
    kind, _, rest = key.partition(":")
    key = f"{kind}:{owner}/{new}:{rest.split(':', 1)[1]}"
    if kind == "code":
        return key, rec
    scopes = {}
    for scope, bound in rec.get("scopes", {}).items():
        base, _, filter_ = scope.partition("!")
        if filter_ == f"server={owner}/{old}":
            scope = f"{base}!server={owner}/{new}"
        code = bound.get("code", "")
        if code.startswith(f"code:{owner}/{old}:"):
            bound = {**bound, "code": f"code:{owner}/{new}:{code.split(':', 2)[2]}"}
        scopes[scope] = bound
    return key, {**rec, "project": new, "scopes": scopes}


class LinkAccessRecords(records.Records):
    """How long access accepted through the project's share links lasts: the links
    made to last until revoked, and each person's scopes that end with a link. Their
    keys and scopes name the project's server: kept under the old name after a rename,
    a link made to last until revoked would end with its link, and access that was to
    end with a link would last until revoked (the sweep finds no such project)."""

    what = "share links' access times"
    store = linkaccess.LinkAccess

    def _store(self) -> linkaccess.LinkAccess:
        return linkaccess.store_in(self.where.records_dir)

    def _drop(self, keep) -> None:
        store = self._store()
        if not store.path.exists():
            return
        with store.locked():
            current = store._read()
            kept = {k: v for k, v in current.items() if keep(*_project_of(k))}
            if kept != current:
                store._write(kept)

    def move(self, owner: str, old: str, new: str) -> records.Undo | None:
        store = self._store()
        if not store.path.exists():
            return None
        with store.locked():
            current = store._read()
            touched = {
                k: v for k, v in current.items() if _project_of(k) in ((owner, old), (owner, new))
            }
            if not touched:
                return None
            after = {k: v for k, v in current.items() if k not in touched}
            for key, rec in touched.items():
                if _project_of(key) == (owner, old):
                    new_key, new_rec = _renamed(key, rec, owner, old, new)
                    after[new_key] = new_rec
            store._write(after)
            added = set(after) - set(current)

        def undo() -> None:
            with store.locked():
                now = {k: v for k, v in store._read().items() if k not in added}
                store._write({**now, **touched})

        return undo

    def holds(self, owner: str, project: str) -> bool:
        store = self._store()
        if not store.path.exists():
            return False
        with store.locked():
            return any(_project_of(k) == (owner, project) for k in store._read())

    def forget(self, owner: str, project: str) -> None:
        self._drop(lambda o, p: (o, p) != (owner, project))

    def forget_owner(self, owner: str) -> None:
        self._drop(lambda o, p: o != owner)


def _delete_roles(db, names: list[str]) -> None:
    """JupyterHub's roles of these names (on the loop's thread)."""
    for name in names:
        if orm.Role.find(db, name) is not None:
            hub_roles.delete_role(db, name)


def _remake(db, roles: groupshares.GroupShareRoles, owner: str, project: str, names) -> bool:
    """On the loop's thread: delete the roles ``names``, make the project's roles again
    from its group shares; whether it has any."""
    _delete_roles(db, names)
    user = orm.User.find(db, owner)
    spawner = user.orm_spawners.get(project) if user is not None else None
    if spawner is None:
        return False
    # The roles and their record change with JupyterHub's database, which only the
    # loop's thread may touch; the record's lock is held for one read and one write.
    with blocking.allowed("making a renamed project's group-share roles again"):
        roles.sync_project(db, spawner)
    return any(s.group is not None for s in spawner.shares)


class GroupShareRecords(records.Records):
    """The roles mirroring the project's group shares: recorded in the hub's folder
    and held in JupyterHub's database, named after the project. A rename makes them
    again from the renamed server's shares (after the server row moved)."""

    what = "group shares' roles"
    store = groupshares.GroupShareRoles
    server = True

    def _store(self) -> groupshares.GroupShareRoles:
        return groupshares.GroupShareRoles(Path(self.where.records_dir) / groupshares.FILE_NAME)

    def move(self, owner: str, old: str, new: str) -> records.Undo | None:
        roles, where = self._store(), self.where
        gone = roles.forget(owner, old)
        names = gone + roles.forget(owner, new)
        had = where.on_loop(_remake, where.db, roles, owner, new, names)
        if not gone and not had:
            return None
        return lambda: self.move(owner, new, old)

    def forget(self, owner: str, project: str) -> None:
        names = self._store().forget(owner, project)
        self.where.on_loop(_delete_roles, self.where.db, names)

    def forget_owner(self, owner: str) -> None:
        names = self._store().forget(owner, None)
        self.where.on_loop(_delete_roles, self.where.db, names)
