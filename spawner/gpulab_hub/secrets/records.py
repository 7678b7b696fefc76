"""The owner's choice of secrets for each project, as rename and delete see them
(records.py): one file per user (store.py), its ``projects`` naming each project."""

from __future__ import annotations

from pathlib import Path

from gpulab_hub import hubsettings, records
from gpulab_hub.secrets import store as secret_store


class SecretChoiceRecords(records.Records):
    """Which of the owner's secrets each project gets; on an account's deletion, the
    secrets themselves (removed, never archived)."""

    what = "choice of secrets"
    store = secret_store.SecretStore

    def _folder(self) -> Path:
        return Path(self.where.records_dir) / hubsettings.SECRETS

    def move(self, owner: str, old: str, new: str) -> records.Undo | None:
        return secret_store.SecretStore(self._folder(), owner, self.where.log).move_project(
            old, new
        )

    def holds(self, owner: str, project: str) -> bool:
        try:
            store = secret_store.SecretStore(self._folder(), owner, self.where.log)
            return project in store.selections()
        except ValueError:
            return False  # not an account name gpulab allows: it never had secrets

    def forget(self, owner: str, project: str) -> None:
        self._forget(owner, project)

    def forget_owner(self, owner: str) -> None:
        self._forget(owner, None)

    def _forget(self, owner: str, project: str | None) -> None:
        try:
            if project is None:
                secret_store.forget_user(self._folder(), owner)
            else:
                store = secret_store.SecretStore(self._folder(), owner, self.where.log)
                store.forget_project(project)
        except ValueError:
            return  # not an account name gpulab allows: it never had secrets
        except (OSError, secret_store.SecretStore.Error) as e:
            self.where.log.error(
                "The secrets of %s (%s) were not removed: %s", owner, project or "all", e
            )
