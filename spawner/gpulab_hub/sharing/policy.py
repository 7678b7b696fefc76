"""What an owner allows the people a project is shared with, kept by the hub.

Kept in the hub's folder, never in the project's: collaborators can write the
project's files, and must not be able to grant themselves more.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from gpulab_hub import jsonfile, stateversion


@dataclass(frozen=True)
class ProjectSharing:
    collaborators_may_start: bool = False  # start the owner's stopped server
    collaborators_may_reshare: bool = False  # share the project on with others


class SharingPolicyStore(jsonfile.LockedRecord):
    """One JSON file of ``{"owner/project": {...}}``; every change under a file lock."""

    kind = stateversion.KINDS["sharing-policy"]
    section = "projects"
    what = "The sharing settings file"
    on_damage = (
        "every shared project is back to the defaults (collaborators may not start the "
        "server or share it on) until its owner sets them again on the project's Share page"
    )

    def _parse(self, section) -> dict:
        section = super()._parse(section)
        known = {f.name for f in fields(ProjectSharing)}
        for key, raw in section.items():
            if not all(isinstance(v, bool) for v in raw.values()) or not set(raw) <= known:
                raise TypeError(f"the settings of {key} are not {', '.join(sorted(known))}")
        return section

    def get(self, owner: str, project: str) -> ProjectSharing:
        """The project's settings; the defaults (least allowed) if the file is unreadable."""
        try:
            with self.locked():
                raw = self._read().get(f"{owner}/{project}", {})
        except jsonfile.RecordError as e:
            self.log.error("%s", e)
            return ProjectSharing()
        known = {f.name for f in fields(ProjectSharing)}
        return ProjectSharing(**{k: bool(v) for k, v in raw.items() if k in known})

    def snapshot(self) -> dict[str, ProjectSharing]:
        """Every project's settings by "owner/project", read once (blocking: call it
        off the event loop); {} if the file is unreadable (the defaults everywhere)."""
        try:
            with self.locked():
                projects = self._read()
        except jsonfile.RecordError as e:
            self.log.error("%s", e)
            return {}
        known = {f.name for f in fields(ProjectSharing)}
        return {
            key: ProjectSharing(**{k: bool(v) for k, v in raw.items() if k in known})
            for key, raw in projects.items()
        }

    def set(self, owner: str, project: str, **changes: bool) -> ProjectSharing:
        with self.locked():
            projects = self._read()
            key = f"{owner}/{project}"
            current = ProjectSharing(**projects.get(key, {}))
            new = ProjectSharing(**{**asdict(current), **{k: bool(v) for k, v in changes.items()}})
            projects[key] = asdict(new)
            self._write(projects)
            return new

    def forget(self, owner: str, project: str) -> None:
        """Drop a deleted project's record."""
        with self.locked():
            projects = self._read()
            if projects.pop(f"{owner}/{project}", None) is not None:
                self._write(projects)

    def forget_owner(self, owner: str) -> None:
        """Drop the records of every project of a deleted user."""
        with self.locked():
            projects = self._read()
            kept = {k: v for k, v in projects.items() if k.split("/", 1)[0] != owner}
            if kept != projects:
                self._write(kept)
