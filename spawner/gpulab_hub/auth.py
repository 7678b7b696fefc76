"""Authentication: NativeAuthenticator (bcrypt-hashed passwords, sign-up with
admin approval) plus a first admin account created on the hub's first start."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from nativeauthenticator import NativeAuthenticator
from nativeauthenticator import handlers as native
from nativeauthenticator.orm import UserInfo
from traitlets import Unicode


class LoginHandler(native.LoginHandler):
    """NativeAuthenticator 1.3's login page, mended for JupyterHub 6.

    Its POST uses ``self.statsd`` (removed from JupyterHub) and its ``_render``
    rejects the ``sync`` argument JupyterHub passes when rendering errors; the
    page and the password check are NativeAuthenticator's own.
    """

    def _render(self, login_error=None, username=None, **kwargs):
        return super()._render(login_error=login_error, username=username)

    async def post(self):
        data = {arg: self.get_argument(arg, strip=False) for arg in self.request.body_arguments}
        data.pop("_xsrf", None)
        data["username"] = data.get("username", "").strip()
        user = await self.login_user(data)
        if user:
            self._jupyterhub_user = user
            self.redirect(self.get_next_url(user))
            return
        error = "Invalid username or password."
        info = self.authenticator.get_user(data["username"])
        if info is not None and not info.is_authorized:
            if info.is_valid_password(data.get("password", "")):
                error = f"User {data['username']} has not been approved by an administrator yet."
        self.set_status(403)
        self.finish(await self._render(login_error=error, username=data["username"]))


class GpulabAuthenticator(NativeAuthenticator):
    """Users sign up at /hub/signup; an admin approves them at /hub/authorize."""

    first_admin = Unicode(
        "admin",
        config=True,
        help="""Name of the admin account created on the hub's first start (also
        listed in ``Authenticator.admin_users``). Default: admin.
        Example: ``c.GpulabAuthenticator.first_admin = "root"``""",
    )
    first_admin_password = Unicode(
        "",
        config=True,
        help="""Password of the first admin. Default: empty, meaning a random one is
        generated and written to ``first_admin_password_file`` (or logged once).
        Example:
        ``c.GpulabAuthenticator.first_admin_password = os.environ["GPULAB_ADMIN_PASSWORD"]``
        """,
    )
    first_admin_password_file = Unicode(
        "",
        config=True,
        help="""Where a generated first-admin password is written (mode 0600) for
        ``gpulab up`` to print once and delete. Default: empty (not written; the
        password is logged instead).
        Example:
        ``c.GpulabAuthenticator.first_admin_password_file = "/srv/gpulab/hub/admin-pw"``
        """,
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ensure_first_admin()

    def get_handlers(self, app):
        return [
            (route, LoginHandler if route == r"/login" else handler)
            for route, handler in super().get_handlers(app)
        ]

    def ensure_first_admin(self) -> str | None:
        """Create the first admin if it has no password yet; return the password."""
        name = self.normalize_username(self.first_admin)
        if UserInfo.find(self.db, name) is not None:
            return None
        password = self.first_admin_password or secrets.token_urlsafe(12)
        info = UserInfo(
            username=name,
            password=_hash(password),
            is_authorized=True,
        )
        self.db.add(info)
        self.db.commit()
        if self.first_admin_password:
            self.log.info("Created the first admin %r with the configured password", name)
            return password
        if self.first_admin_password_file:
            path = Path(self.first_admin_password_file)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(f"{name}\n{password}\n")
            self.log.warning("Created the first admin %r; its password is in %s", name, path)
        else:
            self.log.warning("Created the first admin %r with password: %s", name, password)
        return password


def _hash(password: str) -> bytes:
    import bcrypt

    return bcrypt.hashpw(password.encode(), bcrypt.gensalt())
