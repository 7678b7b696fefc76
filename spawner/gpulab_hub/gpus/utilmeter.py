"""The average GPU utilisation of each holding, for the usage ledger.

The hub's metrics thread (metrics.py, every 10 s) reads each GPU's utilisation from
NVML (gpus/nvml.py) and adds it, weighted by the time since the last reading, to every
holding of that GPU. When a project gives its GPUs back, ``record_usage`` takes the holding's
average into its ledger record. What the meter saw is the hub process's own: after
a hub restart a holding's average covers the time since. A gap of more than
``GAP`` seconds between readings is not counted (the hub was busy or stopped), and a
GPU NVML cannot measure (a MIG instance, WSL2) has no average (``None``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from gpulab_hub.gpus import allocator

GAP = 60.0  # seconds: a longer gap between readings is left out
FORGET = 86400.0  # seconds: a holding not seen for this long is dropped (bounded memory)

Key = tuple[str, str, str]  # owner, project, GPU UUID


class Meter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._acc: dict[Key, list[float]] = {}  # key -> [util-seconds, seconds, last seen]
        self._last: float | None = None

    def sample(self, held: allocator.Held, utils: Mapping[str, float | None], now: float) -> None:
        """Count one reading: ``utils`` (UUID -> percent) over the time since the last."""
        with self._lock:
            dt = 0.0 if self._last is None else now - self._last
            self._last = now
            for uuid, holders in held.items():
                util = utils.get(uuid)
                for h in holders:
                    acc = self._acc.setdefault((h.owner, h.project, uuid), [0.0, 0.0, now])
                    acc[2] = now
                    if util is not None and 0 < dt <= GAP:
                        acc[0] += min(max(float(util), 0.0), 100.0) * dt
                        acc[1] += dt
            for key in [k for k, a in self._acc.items() if now - a[2] > FORGET]:
                del self._acc[key]

    def take(self, owner: str, project: str, uuid: str) -> float | None:
        """The holding's average utilisation (percent), forgotten after; None if unmeasured."""
        with self._lock:
            acc = self._acc.pop((owner, project, uuid), None)
        if not acc or acc[1] <= 0:
            return None
        return round(acc[0] / acc[1], 1)


METER = Meter()  # the hub process's one meter


def utilisation() -> dict[str, float | None]:
    """Blocking: each GPU's utilisation now (percent) from NVML; {} without NVML."""
    from gpulab_hub.gpus import nvml

    return nvml.utilisation()
