"""The hub page ``/hub/gpulab/secrets``: each user's own secrets, and which of their
projects get which.

Every change is a form POST (JupyterHub's XSRF check): add or replace a secret (its
value encrypted before it is stored, never shown again), delete one, choose what one
of the user's own projects gets and whether collaborators' processes get it too.
The page lists names and dates only. Each user sees and changes only their own.
"""

from __future__ import annotations

from jupyterhub.handlers import BaseHandler
from tornado import web

from gpulab_hub import blocking, hubsettings
from gpulab_hub.projects.title import title
from gpulab_hub.secrets import crypt
from gpulab_hub.secrets.names import (
    MAX_SECRETS,
    MAX_VALUE_BYTES,
    SecretRefused,
    check_name,
    check_value,
)
from gpulab_hub.secrets.store import SecretStore

RESTART = "Restart running kernels to use them."


def chosen_message(project: str, names, collaborators: bool) -> str:
    """What the page says once a project's choice is saved."""
    if not names:
        return (
            f"New kernels, terminals and jobs in {project} get none of your secrets. "
            "Kernels running now keep what they started with until they restart."
        )
    said = f"New kernels, terminals and jobs in {project} get: {', '.join(names)}. {RESTART}"
    if collaborators:
        said += " Collaborators' kernels, terminals and jobs get them too."
    return said


class SecretsPageHandler(BaseHandler):
    def _store(self) -> SecretStore:
        db_url = hubsettings.of_handler(self).db_url
        return SecretStore(db_url, self.current_user.name, self.log)

    def _projects(self) -> list[str]:
        """The user's own projects (JupyterHub's named servers), by name."""
        return sorted(name for name in self.current_user.orm_user.orm_spawners if name)

    def set_default_headers(self):
        super().set_default_headers()
        self.set_header("Cache-Control", "no-store")

    async def _page(self, status: int = 200, message: str = "", error: str = "", kept: str = ""):
        store = self._store()
        try:
            secrets, selections = await blocking.run(
                blocking.RECORDS, lambda: (store.listing(), store.selections())
            )
        except store.Error as e:
            self.log.error("gpulab: %s", e)
            message = "The hub cannot read your secrets now; try again later."
            raise web.HTTPError(503, message) from e
        html = await self.render_template(
            "gpulab-secrets.html",
            secrets=secrets,
            projects=self._projects(),
            titles={n: title(s) for n, s in self.current_user.orm_user.orm_spawners.items()},
            selections=selections,
            message=message,
            error=error,
            kept_name=kept,
            max_secrets=MAX_SECRETS,
            max_kib=MAX_VALUE_BYTES // 1024,
        )
        self.set_status(status)
        self.finish(html)

    async def _act(self) -> str:
        """Do the form's action; what to tell the user (SecretRefused: why not)."""
        action = self.get_body_argument("action", "")
        store = self._store()
        if action in ("add", "replace"):
            name = check_name(self.get_body_argument("name", ""))
            value = check_value(self.get_body_argument("value", ""))
            encrypted = await crypt.encrypt(value)
            new = await blocking.run(blocking.RECORDS, store.put, name, encrypted)
            done = "added" if new else "replaced"
            self.log.info("gpulab: %s %s the secret %s", store.user, done, name)
            if new:
                return f"Added {name}. Choose below which of your projects get it."
            return (
                f"Replaced the value of {name}. New kernels, terminals and jobs get the new "
                "value; restart running kernels to use it."
            )
        if action == "delete":
            name = self.get_body_argument("name", "")
            if not await blocking.run(blocking.RECORDS, store.delete, name):
                raise SecretRefused(f"You have no secret named {name[:70]}.")
            self.log.info("gpulab: %s deleted the secret %s", store.user, name)
            return (
                f"Deleted {name}. New kernels, terminals and jobs no longer get it; those "
                "running now keep it until they restart."
            )
        if action == "choose":
            project = self.get_body_argument("project", "")
            if project not in self._projects():
                raise SecretRefused("Choose one of your own projects.")
            names = self.get_body_arguments("names")
            collaborators = self.get_body_argument("collaborators", "") == "1"
            chosen = await blocking.run(
                blocking.RECORDS, store.choose, project, names, collaborators
            )
            self.log.info(
                "gpulab: %s chose the secrets %s for %s (collaborators: %s)",
                store.user, ", ".join(chosen.names) or "-", project, chosen.collaborators,
            )  # fmt: skip
            return chosen_message(project, chosen.names, chosen.collaborators)
        raise SecretRefused("Unknown action: reload the page and try again.")

    @web.authenticated
    async def get(self):
        await self._page()

    @web.authenticated
    async def post(self):
        try:
            message = await self._act()
        except (SecretRefused, crypt.SecretsUnavailable) as e:
            adding = self.get_body_argument("action", "") == "add"
            kept = self.get_body_argument("name", "")[:64] if adding else ""  # never the value
            await self._page(status=400, error=str(e), kept=kept)
            return
        except SecretStore.Error as e:
            self.log.error("gpulab: %s", e)
            await self._page(status=503, error="The hub cannot store your secrets now.")
            return
        await self._page(message=message)
