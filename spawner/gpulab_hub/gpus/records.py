"""The GPU holdings of a project, as rename and delete see them (records.py): the
allocation record (allocator.py) names each holder's project."""

from __future__ import annotations

from gpulab_hub import records
from gpulab_hub.gpus import allocator


class GpuHoldingRecords(records.Records):
    """GPUs are held while a project's server runs; a rename (of a stopped project)
    leaves the record as it is, a deletion releases what the project still holds."""

    what = "GPU holdings"
    store = allocator.AllocationStore
    moves = False

    def _release(self, owner: str, project: str | None) -> None:
        if self.where.allocations_file is None:
            return
        store = allocator.AllocationStore(self.where.allocations_file)
        try:
            store.release_dead(lambda o, p: o != owner or (project is not None and p != project))
        except allocator.AllocationError as e:
            # A damaged GPU record is repaired from Docker by the next GPU spawn (which
            # sees no container of the deleted project); deleting goes on.
            self.where.log.error(
                "GPU holdings of %s/%s not released now: %s", owner, project or "*", e
            )

    def forget(self, owner: str, project: str) -> None:
        self._release(owner, project)

    def forget_owner(self, owner: str) -> None:
        self._release(owner, None)
