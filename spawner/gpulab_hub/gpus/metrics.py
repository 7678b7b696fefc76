"""gpulab's GPU figures on the hub's ``/hub/metrics``, beside JupyterHub's own.

JupyterHub serves Prometheus' default registry at ``/hub/metrics`` (with a token that
has ``read:metrics``); :func:`register` adds one collector to it at the hub's start.
The figures come from gpulab's records (the allocation record, the GPU queue, the
usage ledger) and the host's GPU inventory. They are read by a thread of their own
every ``every`` seconds, never on the hub's event loop, where a scrape only copies the
last snapshot:

- ``gpulab_gpus{state}``: the host's devices, ``free`` or ``held``;
- ``gpulab_gpu_holdings``: projects holding devices;
- ``gpulab_gpu_queue_length`` and ``gpulab_gpu_queue_longest_wait_seconds``;
- ``gpulab_gpu_hours{user}``: GPU-hours over the fair-share window (ledger and
  holdings under way);
- ``gpulab_metrics_snapshot_age_seconds``: how old the figures are (a stalled reader
  shows here, not as stale numbers that look fresh).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector
from sqlalchemy.exc import SQLAlchemyError

from gpulab_hub import gpus
from gpulab_hub.gpus import allocator, queue, usage, utilmeter

LOG = logging.getLogger("gpulab_hub.metrics")
WEEK = 7 * 24 * 3600.0


@dataclass(frozen=True)
class Sources:
    """Where the figures come from (the hub's record files) and how to read GPUs."""

    allocations_file: Path
    queue_file: Path
    db_url: str  # the hub's database: the usage ledger (gpus/usage.py)
    window: float = WEEK
    retention: float = usage.RETENTION_DAYS * usage.DAY
    inventory: Callable[[], gpus.Inventory] = gpus.inventory

    @classmethod
    def of_config(cls, c) -> Callable[[], Sources]:
        """The sources as the hub's configuration ``c`` names them, read when the figures
        are (so lines an admin adds after gpulab's in jupyterhub_config.py count)."""
        from gpulab_hub.gpus.spawner import GpuTraits, cached_inventory, db_url_of

        def resolve() -> Sources:
            names = (
                "allocations_file", "queue_file", "gpu_usage_window", "gpu_usage_retention_days"
            )  # fmt: skip
            section = c.ProjectSpawner
            s = GpuTraits(**{n: section[n] for n in names if n in section})
            return cls(
                Path(s.allocations_file),
                Path(s.queue_file),
                db_url_of(s, c),
                window=float(s.gpu_usage_window),
                retention=float(s.gpu_usage_retention_days) * usage.DAY,
                inventory=cached_inventory,
            )

        return resolve


@dataclass(frozen=True)
class Snapshot:
    taken_at: float = 0.0
    free: int = 0
    held: int = 0
    holdings: int = 0
    queue_length: int = 0
    longest_wait: float = 0.0
    hours: dict[str, float] = field(default_factory=dict)


def read(src: Sources, now: float | None = None) -> Snapshot:
    """The figures now (blocking: files, NVML)."""
    now = time.time() if now is None else now
    inv = src.inventory()
    held = allocator.AllocationStore(src.allocations_file).holdings()
    uuids = {d.uuid for d in inv.devices}
    busy = {u for u, hs in held.items() if hs and u in uuids}
    waiting = queue.QueueStore(src.queue_file).entries()
    ledger = usage.UsageLedger(src.db_url, retention=src.retention)
    return Snapshot(
        taken_at=now,
        free=len(uuids - busy),
        held=len(busy),
        holdings=len({h.key for hs in held.values() for h in hs}),
        queue_length=len(waiting),
        longest_wait=max((now - e.enqueued_at for e in waiting), default=0.0),
        hours=ledger.hours_by_user(src.window, now=now, held=held),
    )


class GpuCollector(Collector):
    """The collector Prometheus' registry asks at each scrape: the last snapshot."""

    def __init__(self, sources: Callable[[], Sources], every: float = 10.0, clock=time.time):
        self.sources, self.every, self.clock = sources, every, clock
        self._snapshot = Snapshot()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh(self) -> None:
        try:
            src, now = self.sources(), self.clock()
            snap = read(src, now)
            held = allocator.AllocationStore(src.allocations_file).holdings()
            if held:  # average utilisation of each holding, for the usage ledger
                utilmeter.METER.sample(held, utilmeter.utilisation(), now)
        except (
            OSError, allocator.AllocationError, queue.QueueError, usage.UsageError,
            SQLAlchemyError,
        ) as e:  # fmt: skip
            LOG.warning("gpulab's GPU figures not read: %s", e)
            return
        with self._lock:
            self._snapshot = snap

    def start(self) -> None:
        def loop():
            while not self._stop.is_set():
                self.refresh()
                self._stop.wait(self.every)

        self._thread = threading.Thread(target=loop, name="gpulab-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def collect(self):
        with self._lock:
            s = self._snapshot
        gpus_ = GaugeMetricFamily("gpulab_gpus", "GPUs of this host, by state", labels=["state"])
        gpus_.add_metric(["free"], s.free)
        gpus_.add_metric(["held"], s.held)
        yield gpus_
        yield GaugeMetricFamily("gpulab_gpu_holdings", "Projects holding GPUs", value=s.holdings)
        yield GaugeMetricFamily(
            "gpulab_gpu_queue_length", "Starts waiting for a GPU", value=s.queue_length
        )
        yield GaugeMetricFamily(
            "gpulab_gpu_queue_longest_wait_seconds",
            "How long the longest-waiting start has waited",
            value=s.longest_wait,
        )
        hours = GaugeMetricFamily(
            "gpulab_gpu_hours",
            "GPU-hours per user over the fair-share window",
            labels=["user"],
        )
        for user, h in sorted(s.hours.items()):
            hours.add_metric([user], h)
        yield hours
        yield GaugeMetricFamily(
            "gpulab_metrics_snapshot_age_seconds",
            "Seconds since gpulab last read its GPU figures (-1: not yet)",
            value=(self.clock() - s.taken_at) if s.taken_at else -1.0,
        )


_registered: GpuCollector | None = None


def register(sources: Callable[[], Sources], every: float = 10.0) -> GpuCollector:
    """Add gpulab's collector to the registry ``/hub/metrics`` serves (once per process)
    and start its reader."""
    global _registered
    if _registered is None:
        _registered = GpuCollector(sources, every)
        REGISTRY.register(_registered)
        _registered.start()
    return _registered
