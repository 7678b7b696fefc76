"""The first admin is never locked out (issue 35, item 9): its generated password is
written before its account is made. When the write fails (the hub's folder not
writable: here a file where its folder belongs, or a folder where the password file
belongs, which stop root as well), the hub makes no admin, stops with a sentence saying
why, and logs no password; once the folder is mended, the next start makes the admin,
whose password (in the file, for `gpulab up` to print) logs in."""

from __future__ import annotations

import logging

import pytest
from jupyterhub import orm
from nativeauthenticator.orm import UserInfo

from gpulab_hub.accounts.auth import FirstAdminError, GpulabAuthenticator


class Kept(logging.Handler):
    """Every message of the authenticator's log (the hub's log, in a hub). Its own
    handler: the database's set-up (alembic) configures the root logger again."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())

    @property
    def text(self) -> str:
        return "\n".join(self.messages)


KEPT = Kept()


@pytest.fixture(autouse=True)
def logged():
    KEPT.messages.clear()
    yield KEPT


def log() -> logging.Logger:
    logger = logging.getLogger("test_first_admin")
    logger.disabled, logger.propagate = False, False
    logger.setLevel(logging.DEBUG)
    if KEPT not in logger.handlers:
        logger.addHandler(KEPT)
    return logger


def start(db, password_file, **traits) -> GpulabAuthenticator:
    """What the hub's start does with its authenticator (its __init__ makes the admin)."""
    return GpulabAuthenticator(
        db=db, log=log(), first_admin_password_file=str(password_file), **traits
    )


def no_folder(path):
    path.parent.parent.mkdir(parents=True, exist_ok=True)
    path.parent.write_text("a file where the hub's folder belongs\n")


def folder_in_place(path):
    path.mkdir(parents=True)


def mend(path):
    if path.is_dir():
        path.rmdir()
    elif path.parent.is_file():
        path.parent.unlink()


@pytest.mark.parametrize("unwritable", [no_folder, folder_in_place])
async def test_a_failed_password_write_makes_no_admin_and_logs_no_password(
    tmp_path, logged, unwritable
):
    db = orm.new_session_factory(f"sqlite:///{tmp_path / 'hub.sqlite'}")()
    password_file = tmp_path / "hub" / "first-admin-password"
    unwritable(password_file)

    with pytest.raises(FirstAdminError) as refused:
        start(db, password_file)
    words = str(refused.value)
    assert words.startswith("gpulab made no first admin 'admin': its generated password")
    assert f"could not be written to {password_file}" in words
    assert "Give the hub's account write access" in words
    assert UserInfo.find(db, "admin") is None  # nobody holds a password no one knows

    mend(password_file)
    auth = start(db, password_file)
    name, password = password_file.read_text().splitlines()
    assert name == "admin" and len(password) >= 12
    assert oct(password_file.stat().st_mode & 0o777) == "0o600"
    assert await auth.authenticate(None, {"username": "admin", "password": password}) == "admin"
    assert await auth.authenticate(None, {"username": "admin", "password": "wrong"}) is None
    # Neither the failed start nor the good one put the password in the log.
    assert "its password is in" in logged.text
    assert password not in logged.text


def test_without_a_password_or_a_file_the_hub_refuses_in_words(tmp_path, logged):
    db = orm.new_session_factory("sqlite://")()
    with pytest.raises(FirstAdminError, match="never writes a password to the log"):
        GpulabAuthenticator(db=db, log=log())
    assert UserInfo.find(db, "admin") is None
    assert "password:" not in logged.text


async def test_a_configured_password_needs_no_file(tmp_path):
    db = orm.new_session_factory("sqlite://")()
    given = "a configured admin passphrase 9"
    auth = start(db, tmp_path / "nowhere" / "pw", first_admin_password=given)
    assert not (tmp_path / "nowhere").exists()
    assert await auth.authenticate(None, {"username": "admin", "password": given}) == "admin"
