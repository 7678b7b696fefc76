"""What an owner allows the people a project is shared with, kept by the hub.

Kept in the hub's folder, never in the project's: collaborators can write the
project's files, and must not be able to grant themselves more.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from gpulab_hub import jsonfile


@dataclass(frozen=True)
class ProjectSharing:
    collaborators_may_start: bool = False  # start the owner's stopped server
    collaborators_may_reshare: bool = False  # share the project on with others


class SharingPolicyStore(jsonfile.LockedRecord):
    """One JSON file of ``{"owner/project": {...}}``; every change under a file lock."""

    section = "projects"

    def get(self, owner: str, project: str) -> ProjectSharing:
        with self._thread_lock, self._file_lock:
            raw = self._read().get(f"{owner}/{project}", {})
        known = {f.name for f in fields(ProjectSharing)}
        return ProjectSharing(**{k: bool(v) for k, v in raw.items() if k in known})

    def set(self, owner: str, project: str, **changes: bool) -> ProjectSharing:
        with self._thread_lock, self._file_lock:
            projects = self._read()
            key = f"{owner}/{project}"
            current = ProjectSharing(**projects.get(key, {}))
            new = ProjectSharing(**{**asdict(current), **{k: bool(v) for k, v in changes.items()}})
            projects[key] = asdict(new)
            self._write(projects)
            return new

    def forget(self, owner: str, project: str) -> None:
        """Drop a deleted project's record."""
        with self._thread_lock, self._file_lock:
            projects = self._read()
            if projects.pop(f"{owner}/{project}", None) is not None:
                self._write(projects)
