"""Access accepted through a share link ends with the link (sharing/linkaccess.py), on
JupyterHub's own database and its own ``ShareCode.exchange`` (what gpulab's accept
page calls, through linkaccess.accept_async; here its blocking twin, linkaccess.accept),
with the hub's clock moved forward instead of waiting an hour."""

from __future__ import annotations

from datetime import timedelta

import pytest
from jupyterhub import orm
from jupyterhub.utils import utcnow

from gpulab_hub import jsonfile
from gpulab_hub.sharing import linkaccess, roles


@pytest.fixture
def hub_db(tmp_path):
    """A JupyterHub database with alice's project and bob, carol and dave; gpulab's
    acceptance recording installed on it as in the hub."""
    db = orm.new_session_factory("sqlite://")()
    alice = orm.User(name="alice")
    db.add(alice)
    for name in ("bob", "carol", "dave"):
        db.add(orm.User(name=name))
    db.commit()
    spawner = orm.Spawner(user=alice, name="alice-first")
    db.add(spawner)
    db.commit()
    linkaccess.install(tmp_path, revoke_within_s=8)
    yield db, spawner, linkaccess.hub_store()
    db.close()


def link(db, spawner, role: str, lasts: str = linkaccess.DEFAULT_LASTS, hours: int = 1):
    code, _ = orm.ShareCode.new(
        db,
        spawner,
        scopes=roles.share_scopes(role, "alice", "alice-first"),
        expires_in=hours * 3600,
    )
    linkaccess.hub_store().mark(code, lasts)
    return code


def role(db, spawner, name: str) -> str:
    share = orm.Share.find(db, spawner, orm.User.find(db, name))
    return "none" if share is None else roles.role_of(share.scopes)


def later(hours: float):
    return utcnow(with_tz=False) + timedelta(hours=hours)


def test_a_links_access_ends_when_the_link_expires_by_default(hub_db):
    db, spawner, store = hub_db
    assert linkaccess.DEFAULT_LASTS == linkaccess.LINK
    code = link(db, spawner, "viewer")
    linkaccess.accept(code, orm.User.find(db, "bob"))
    assert role(db, spawner, "bob") == "viewer"
    assert store.ends("alice", "alice-first", "user", "bob") == linkaccess.iso(code.expires_at)
    # Before the hour is up nothing changes; after it, bob has no access left.
    assert store.sweep(db, now=later(0.5)) == 0
    assert role(db, spawner, "bob") == "viewer"
    assert store.sweep(db, now=later(1.01)) == 1
    assert role(db, spawner, "bob") == "none"
    assert store.ends("alice", "alice-first", "user", "bob") == ""


def test_access_lasts_until_revoked_when_the_owner_chose_so(hub_db):
    db, spawner, store = hub_db
    code = link(db, spawner, "collaborator", lasts=linkaccess.REVOKED)
    linkaccess.accept(code, orm.User.find(db, "bob"))
    assert store.sweep(db, now=later(1000)) == 0
    assert role(db, spawner, "bob") == "collaborator"
    assert store.ends("alice", "alice-first", "user", "bob") == ""


def test_a_links_end_takes_only_what_the_link_gave(hub_db):
    """Carol was shared with by name as a viewer; a collaborator link she accepts
    makes her a collaborator for its hour, then a viewer again."""
    db, spawner, store = hub_db
    carol = orm.User.find(db, "carol")
    orm.Share.grant(db, spawner, carol, scopes=roles.share_scopes("viewer", "alice", "alice-first"))
    linkaccess.accept(link(db, spawner, "collaborator"), carol)
    assert role(db, spawner, "carol") == "collaborator"
    store.sweep(db, now=later(2))
    assert role(db, spawner, "carol") == "viewer"


def test_sharing_by_name_or_a_lasting_link_keeps_the_access(hub_db):
    db, spawner, store = hub_db
    bob, dave = orm.User.find(db, "bob"), orm.User.find(db, "dave")
    linkaccess.accept(link(db, spawner, "viewer"), bob)
    store.lasts_until_revoked("alice", "alice-first", "user", "bob")  # the Share page, by name
    linkaccess.accept(link(db, spawner, "viewer"), dave)
    linkaccess.accept(link(db, spawner, "viewer", lasts=linkaccess.REVOKED), dave)
    store.sweep(db, now=later(5))
    assert role(db, spawner, "bob") == "viewer"
    assert role(db, spawner, "dave") == "viewer"


def test_a_later_link_extends_and_revoking_a_link_ends_its_access(hub_db):
    db, spawner, store = hub_db
    bob = orm.User.find(db, "bob")
    first = link(db, spawner, "viewer", hours=1)
    linkaccess.accept(first, bob)
    second = link(db, spawner, "viewer", hours=3)
    linkaccess.accept(second, bob)
    store.sweep(db, now=later(2))
    assert role(db, spawner, "bob") == "viewer"  # the second link still runs
    # The owner revokes the second link: what it gave ends now.
    assert store.end_link(db, linkaccess.code_key(second)) == 1
    assert role(db, spawner, "bob") == "none"


def test_a_share_made_again_is_not_ended_by_an_old_links_record(hub_db):
    db, spawner, store = hub_db
    bob = orm.User.find(db, "bob")
    linkaccess.accept(link(db, spawner, "viewer"), bob)
    orm.Share.revoke(db, spawner, bob)  # revoked through JupyterHub's API...
    db.commit()
    orm.Share.grant(db, spawner, bob, scopes=roles.share_scopes("viewer", "alice", "alice-first"))
    store.sweep(db, now=later(2))  # ...and shared again: not the link's any more
    assert role(db, spawner, "bob") == "viewer"


def test_no_lasting_access_when_the_record_cannot_be_written(hub_db):
    """An invitee whose acceptance gpulab cannot record gets nothing, not access for ever."""
    db, spawner, store = hub_db
    code = link(db, spawner, "collaborator")
    store.path.unlink(missing_ok=True)
    store.path.mkdir()  # the record unreadable: a folder in its place
    with pytest.raises(jsonfile.RecordError):
        linkaccess.accept(code, orm.User.find(db, "bob"))
    assert role(db, spawner, "bob") == "none"


def test_the_share_form_offers_viewer_first():
    assert roles.DEFAULT_ROLE == "viewer"
