"""One provider account, one gpulab account (accounts/identities.py), without a provider:
which names gpulab takes as the provider sends them, the record that binds each account
to its first identity, and how each provider's login model names the person. The logins
themselves, against a real slapd and a real OpenID Connect provider, are in
test_auth_ldap.py and test_auth_oidc.py."""

from __future__ import annotations

import pytest
from traitlets.config import Config

from gpulab_hub.accounts import auth, identities

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


def test_the_first_identity_keeps_the_name(tmp_path):
    store = identities.IdentityStore(tmp_path / identities.FILE_NAME)
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
    assert store.claim("carol", other) == "bound"


def test_the_admins_pinned_identity_wins_over_the_record(tmp_path):
    store = identities.IdentityStore(tmp_path / identities.FILE_NAME)
    first = ("ldap", "entryUUID=first")
    assert store.claim("admin", first) == "bound"
    assert store.claim("admin", first, pinned="entryUUID=named") == "taken"
    assert store.claim("admin", ("ldap", "entryUUID=named"), pinned="entryUUID=named") == "bound"
    assert store.claim("admin", first) == "taken"


def test_a_damaged_record_is_moved_aside_and_says_what_that_means(tmp_path, caplog):
    path = tmp_path / identities.FILE_NAME
    path.write_text('{"version": 1, "accounts": {"carol": {"id": 7}}}')
    store = identities.IdentityStore(path)
    assert store.bound("carol") is None
    assert list(tmp_path.glob(identities.FILE_NAME + ".corrupt-*"))
    assert "bound again at its next login" in caplog.text


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
