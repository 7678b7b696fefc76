"""The multi-node jobs of a project, as rename and delete see them (records.py): the
hub's record of the Slurm jobs it submitted (jobs.py) names each job's project."""

from __future__ import annotations

from gpulab_hub import records
from gpulab_hub.cluster import jobs


class JobsRecords(records.Records):
    """A renamed project keeps its multi-node jobs; a new project of a deleted one's
    name never sees them (a job still running runs on)."""

    what = "multi-node jobs"
    store = jobs.JobsRecord

    def move(self, owner: str, old: str, new: str) -> records.Undo | None:
        record = jobs.record_of(self.where.records_dir)
        if not record.move_project(owner, old, new):
            return None
        return lambda: record.move_project(owner, new, old)

    def holds(self, owner: str, project: str) -> bool:
        return jobs.record_of(self.where.records_dir).holds(owner, project)

    def forget(self, owner: str, project: str) -> None:
        jobs.record_of(self.where.records_dir).forget(owner, project)

    def forget_owner(self, owner: str) -> None:
        jobs.record_of(self.where.records_dir).forget(owner, None)
