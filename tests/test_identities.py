"""One provider account, one gpulab account (accounts/identities.py), without a provider:
which names gpulab takes as the provider sends them, the table that binds each account
to its first identity (and the import of the file of gpulab before it), and how each
provider's login model names the person. The logins themselves, against a real slapd
and a real OpenID Connect provider, are in test_auth_ldap.py and test_auth_oidc.py."""

from __future__ import annotations

import json

import hubdb_kit
import pytest
from traitlets.config import Config

from gpulab_hub.accounts import auth, identities, identityfile
from gpulab_hub.db import engine as db_engine
from gpulab_hub.db import migrate

KELVIN = "\u212aaren"  # KELVIN SIGN: "karen" once lower-cased or folded


@pytest.mark.parametrize(
    ("name", "case_unique", "taken"),
    [
        ("carol", False, True),
        ("carol.smith@lab.org", False, True),
        ("Carol", False, False),
        (KELVIN, False, False),
        ("stra\u00dfe", False, False),  # casefold: "strasse"
        ("\uff43arol", False, False),  # FULLWIDTH c: NFKC makes it "c"
        ("Octocat", True, True),  # GitHub: unique whatever the case
        (KELVIN, True, False),  # ... but nothing else is folded
    ],
)
def test_a_name_is_taken_only_as_the_provider_writes_its_canonical_form(name, case_unique, taken):
    words = identities.name_refusal(name, "your organisation's login", case_unique)
    assert (words is None) is taken, words
    if words:
        assert f"as '{name}'" in words and f"('{identities.canonical(name)}')" in words
        assert "Ask a gpulab admin" in words


@pytest.fixture
def store(tmp_path):
    url = hubdb_kit.database(tmp_path / "hub")[0]
    yield identities.IdentityStore(url)
    db_engine.dispose()


def test_the_first_identity_keeps_the_name(store):
    carol = ("oidc https://sso.lab.test", "sub-carol")
    other = ("oidc https://sso.lab.test", "sub-mallory")
    assert store.claim("carol", carol) == "bound"
    assert store.claim("carol", carol) == "same"
    assert store.claim("carol", other) == "taken"
    # another issuer's same sub is another person
    assert store.claim("carol", ("oidc https://elsewhere.test", "sub-carol")) == "taken"
    assert store.bound("carol") == carol
    # deleting the account frees the name for a new one
    store.forget("carol")
    assert store.bound("carol") is None
    assert store.claim("carol", other) == "bound"


def test_the_admins_pinned_identity_wins_over_the_record(store):
    first = ("ldap", "entryUUID=first")
    assert store.claim("admin", first) == "bound"
    assert store.claim("admin", first, pinned="entryUUID=named") == "taken"
    assert store.claim("admin", ("ldap", "entryUUID=named"), pinned="entryUUID=named") == "bound"
    assert store.claim("admin", first) == "taken"


def test_two_first_logins_of_one_name_at_once_bind_it_to_one_of_them(store):
    """Eight people of the provider sign in as ``dora`` at the same moment (threads,
    one transaction each): one gets the name, every other is refused."""
    import concurrent.futures

    def claim(n: int) -> str:
        return identities.IdentityStore(store.url).claim("dora", ("ldap", f"entryUUID={n}"))

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        said = list(pool.map(claim, range(8)))
    assert sorted(said) == ["bound"] + ["taken"] * 7
    assert store.bound("dora") == ("ldap", f"entryUUID={said.index('bound')}")


def test_a_database_the_hub_cannot_read_refuses_the_login(tmp_path):
    """Fails closed: without its record a name would go to whoever signs in first."""
    store = identities.IdentityStore(f"sqlite:///{tmp_path / 'gone.sqlite'}")
    with pytest.raises(identities.IdentityUnavailable, match="cannot be used now"):
        store.claim("carol", ("ldap", "entryUUID=c"))
    assert not (tmp_path / "gone.sqlite").exists()


def _old_file(path, accounts) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": 1, "accounts": accounts}))


def test_the_upgrade_imports_the_old_file_once_and_keeps_it(tmp_path):
    url = hubdb_kit.database(tmp_path / "db")[0]
    path = tmp_path / "hub" / identities.FILE_NAME
    alice = {"provider": "oidc https://sso.lab.test", "id": "sub-alice", "since": 1.0}
    _old_file(path, {"alice": alice, "bob": {"provider": "ldap", "id": "dn=uid=bob"}})
    done = migrate.upgrade(url, backup=False, imports=[identityfile.IdentitiesImport(path)])
    assert "Imported the login identities of 2 account(s)" in " ".join(done.imported)
    assert not path.exists() and path.with_name(path.name + ".imported").is_file()
    store = identities.IdentityStore(url)
    assert store.bound("alice") == ("oidc https://sso.lab.test", "sub-alice")
    assert store.claim("alice", ("oidc https://sso.lab.test", "sub-mallory")) == "taken"
    assert store.claim("bob", ("ldap", "dn=uid=bob")) == "same"
    _old_file(path, {"mallory": alice})  # a file again later: never imported twice
    again = migrate.upgrade(url, backup=False, imports=[identityfile.IdentitiesImport(path)])
    assert "were imported before" in " ".join(again.imported)
    assert store.bound("mallory") is None
    db_engine.dispose()


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"version": 1, "accounts": {"carol": {"id": 7}}}', "has no provider and id"),
        ("{not json", "Expecting property name"),
        ('{"version": 99, "accounts": {}}', "newer gpulab"),
    ],
)
def test_a_damaged_or_newer_old_file_stops_the_upgrade_and_says_what_to_do(tmp_path, text, why):
    """Never imported as empty: each account would be bound again to whoever signs in
    first with its name."""
    url = hubdb_kit.database(tmp_path / "db")[0]
    path = tmp_path / "hub" / identities.FILE_NAME
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(db_engine.DatabaseError, match=why) as refused:
        migrate.upgrade(url, backup=False, imports=[identityfile.IdentitiesImport(path)])
    if "newer" not in why:
        assert "Repair it (or restore it from a backup)" in str(refused.value)
    assert path.read_text() == text and not path.with_name(path.name + ".imported").exists()
    db_engine.dispose()


def github_model(login: str, uid) -> dict:
    """What GitHubOAuthenticator's login gives gpulab: its auth state's GitHub user."""
    return {
        "name": login.lower(),
        "admin": None,
        "auth_state": {"github_user": {"login": login, "id": uid}},
    }


def test_github_binds_the_numeric_user_id_and_folds_only_case():
    a = auth.GpulabGitHubOAuthenticator(config=Config())
    model = github_model("Octocat", 583231)
    assert a.provider_name(model) == "Octocat"
    assert a.login_identity(model) == ("github", "583231")
    assert a.login_identity(github_model("octocat", "583231")) is None  # no number: no id
    assert identities.name_refusal("Octocat", a.login_where, a.names_unique_ignoring_case) is None
