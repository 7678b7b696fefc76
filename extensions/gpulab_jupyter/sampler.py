"""One GPU sampler per Jupyter server: a thread that reads NVML, shared by every tab.

The thread initialises NVML itself (never at import) and reads the cheap
fields of this container's GPUs every tick, the process lists less often, and
the slow fields (PCIe throughput, energy) only when configured. Request
handlers only read what the last tick left (a ready JSON body for the status),
so NVML never runs on the event loop.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque

from traitlets import Bool, Float
from traitlets.config import LoggingConfigurable

from . import devices as gpus
from . import processes, snapshot

NO_DRIVER = (
    "No NVIDIA driver here: the NVML library (libnvidia-ml.so.1) was not found. Either the "
    "host has no NVIDIA driver, or this container was started without GPU support."
)
DRIVER_NOT_LOADED = "The NVIDIA driver's library is here, but the kernel driver is not loaded."
NO_DEVICE = "The NVIDIA driver is here but lists no GPU that this container can open."
STARTING = "The GPU sampler is starting."
REQUEST_TTL = 30.0  # seconds a client's requested interval counts after its last poll


class GPUSampler(LoggingConfigurable):
    """Samples this container's GPUs on a thread of its own. Configure as ``c.GPUSampler.*``."""

    interval = Float(1.0, config=True, help="Seconds between samples when no client asks faster.")
    min_interval = Float(
        0.5, config=True, help="The shortest sampling interval a client may ask for (seconds)."
    )
    process_interval = Float(
        5.0, config=True, help="Seconds between reads of the GPU process lists (slower)."
    )
    history_seconds = Float(
        600.0, config=True, help="Seconds of history kept for the panel's sparklines."
    )
    pcie_throughput = Bool(
        False, config=True, help="Also read PCIe TX/RX throughput (about 20 ms per call per GPU)."
    )
    energy = Bool(False, config=True, help="Also read the energy counter (about 3 ms per GPU).")
    slow_interval = Float(10.0, config=True, help="Seconds between reads of the slow fields.")

    def __init__(self, environ: dict | None = None, **kwargs):
        super().__init__(**kwargs)
        self.environ = dict(os.environ if environ is None else environ)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = None
        self._devices: list[gpus.Device] = []
        self._requests: dict[float, float] = {}  # requested interval -> expiry (monotonic)
        self._history: deque = deque()
        self._slow: dict[str, dict] = {}
        self._extra: dict = {}
        self.stats = dict.fromkeys(
            ("ticks", "tick_seconds", "tick_cpu_seconds", "proc_reads", "proc_seconds",
             "proc_cpu_seconds"), 0
        )  # fmt: skip
        self._state = {"available": False, "reason": "starting", "message": STARTING}
        self._status_body = b""
        self._procs: dict = {"available": False, "timestamp": None, "processes": [], "other": []}
        self._publish(time.time(), {})

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gpulab-sampler", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as e:
                self.log.debug("nvmlShutdown: %s", e)
            self._nvml = None

    # -- what handlers read (any thread) ----------------------------------------------------
    def request_interval(self, seconds: float | None) -> float:
        """A client polls every ``seconds``: sample that often (not under ``min_interval``)."""
        now = time.monotonic()
        if seconds is not None and seconds > 0:
            wanted = round(max(self.min_interval, min(seconds, self.interval)), 1)
            before = self.effective_interval()
            with self._lock:
                self._requests[wanted] = now + REQUEST_TTL
            if wanted < before and self._devices:
                self._wake.set()
            elif wanted < before:
                self._publish(time.time(), {})  # nothing to sample: just say the new pace
        return self.effective_interval()

    def effective_interval(self) -> float:
        now = time.monotonic()
        live = [v for v, until in list(self._requests.items()) if until > now]
        if len(live) < len(self._requests):
            with self._lock:
                self._requests = {v: u for v, u in self._requests.items() if u > now}
        return max(self.min_interval, min([self.interval, *live]))

    def status_body(self) -> bytes:
        return self._status_body

    def history(self, since: float | None = None) -> dict:
        with self._lock:
            rows = [r for r in self._history if since is None or r[0] > since]
        return {**snapshot.history_body(rows, self._devices), **self._common()}

    def processes(self) -> dict:
        return dict(self._procs)

    # -- the thread -------------------------------------------------------------------------
    def _run(self) -> None:
        next_procs = next_slow = 0.0
        while not self._stop.is_set():
            if not self._devices:
                self._setup()
                self._publish(time.time(), {})
                if not self._devices:
                    # No GPU: nothing to sample. A driver does not appear in a running
                    # container, but an NVML error or a late device may clear: look again.
                    retry = self._state["reason"] in ("nvml_error", "none_allocated")
                    self._stop.wait(60.0 if retry else None)
                    continue
            now = time.monotonic()
            do_procs, do_slow = now >= next_procs, now >= next_slow
            self._tick(do_procs, do_slow and (self.pcie_throughput or self.energy))
            next_procs = now + self.process_interval if do_procs else next_procs
            next_slow = now + self.slow_interval if do_slow else next_slow
            spent = time.monotonic() - now
            self._wake.wait(max(0.0, self.effective_interval() - spent))
            self._wake.clear()

    def _fail(self, reason: str, message: str) -> None:
        if self._state.get("message") != message:
            self.log.info("gpulab GPU status: %s", message)
        self._state = {"available": False, "reason": reason, "message": message}

    def _setup(self) -> None:
        visible = self.environ.get("NVIDIA_VISIBLE_DEVICES")
        if visible is not None and visible.strip().lower() in gpus.NO_GPU_VALUES:
            sel = gpus.select([], visible)
            return self._fail(sel.reason, sel.message)
        from .nvml import Nvml, NVMLError, NVMLError_DriverNotLoaded, NVMLError_LibraryNotFound

        try:
            if self._nvml is None:
                self._nvml = Nvml.load()
            found = gpus.enumerate_devices(self._nvml)
            self._extra = {"driver_version": self._nvml.nvmlSystemGetDriverVersion()}
        except NVMLError_LibraryNotFound:
            return self._fail("no_driver", NO_DRIVER)
        except NVMLError_DriverNotLoaded:
            return self._fail("no_driver", DRIVER_NOT_LOADED)
        except NVMLError as e:
            return self._fail("nvml_error", f"NVML failed: {e}")
        if not found:
            return self._fail("none_allocated", NO_DEVICE)
        cuda = self.environ.get("CUDA_VISIBLE_DEVICES")
        sel = gpus.select(found, visible, self._cuda_uuids(found, cuda))
        if not sel.devices:
            return self._fail(sel.reason, sel.message)
        for d in sel.devices:
            gpus.describe(self._nvml, d)
        self._devices = sel.devices
        self._state = {"available": True, "reason": None, "message": ""}
        names = ", ".join(f"{d.name} ({d.uuid})" for d in sel.devices)
        self.log.info("gpulab GPU status: sampling %s", names)

    def _cuda_uuids(self, found: list[gpus.Device], cuda: str | None) -> list[str] | None:
        """CUDA_VISIBLE_DEVICES as UUIDs, parsed the way CUDA does it (nvitop knows how)."""
        if cuda is None:
            return None
        tokens = [t.strip() for t in cuda.split(",")]
        if tokens and {d.uuid for d in found} >= set(tokens):
            return tokens  # full UUIDs (what gpulab sets): nothing to resolve
        from nvitop.api.device import parse_cuda_visible_devices

        by_index = {d.nvml_index: d.uuid for d in found}
        indices = parse_cuda_visible_devices(cuda)
        keys = [f"{i[0]}:{i[1]}" if isinstance(i, tuple) else str(i) for i in indices]
        return [by_index[k] for k in keys if k in by_index]

    def _tick(self, do_procs: bool, do_slow: bool) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        nvml, now = self._nvml, time.time()
        values = {}
        for d in self._devices:
            row = gpus.read_fast(nvml, d)
            if do_slow:
                self._slow[d.uuid] = gpus.read_slow(nvml, d, self.pcie_throughput, self.energy)
            row.update(self._slow.get(d.uuid, {}))
            values[d.uuid] = row
        hist = {u: tuple(v[k] for k in snapshot.HISTORY_FIELDS) for u, v in values.items()}
        with self._lock:
            self._history.append((now, hist))
            while self._history and self._history[0][0] < now - self.history_seconds:
                self._history.popleft()
        spent, cpu = time.perf_counter() - t0, time.thread_time() - c0
        self.stats["ticks"] += 1
        self.stats["tick_seconds"] += spent
        self.stats["tick_cpu_seconds"] += cpu
        self._publish(now, values)
        if do_procs:
            self._read_processes(now)

    def _read_processes(self, now: float) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        driver = {d.uuid: gpus.gpu_processes(self._nvml, d) for d in self._devices}
        local = processes.scan()
        rows, others = processes.attribute(local, driver, {d.uuid: d.minor for d in self._devices})
        index = {d.uuid: i for i, d in enumerate(self._devices)}
        for item in [g for r in rows for g in r["gpus"]] + others:
            item["index"] = index.get(item["uuid"])
        self._procs = {"available": True, "timestamp": now, "processes": rows, "other": others}
        self.stats["proc_reads"] += 1
        self.stats["proc_seconds"] += time.perf_counter() - t0
        self.stats["proc_cpu_seconds"] += time.thread_time() - c0

    def _common(self) -> dict:
        return {
            **self._state,
            "interval": self.effective_interval(),
            "min_interval": self.min_interval,
            "process_interval": self.process_interval,
            "history_seconds": self.history_seconds,
        }

    def _publish(self, now: float, values: dict) -> None:
        rows = snapshot.gpu_rows(self._devices, values)
        body = {
            **self._common(),
            **self._extra,
            "timestamp": round(now, 3),
            "gpus": rows,
            "summary": snapshot.summarize(rows),
            "sampler": snapshot.sampler_stats(self.stats, len(self._devices)),
        }
        self._status_body = json.dumps(body).encode()
