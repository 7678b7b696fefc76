"""One GPU sampler per Jupyter server: a thread that reads NVML, shared by every tab.

The thread initialises NVML itself (never at import) and reads the cheap
fields of this container's GPUs every tick, the process lists less often, and
the slow fields (PCIe throughput, energy) only when configured. Request
handlers only read what the last tick left (a ready JSON body for the status),
so NVML never runs on the event loop.

Nothing a read raises ends the thread: a failed round is logged (with its
traceback the first time an unexpected error is seen), counted, and published
as ``"stale": true`` with the error, the last numbers kept with their own
timestamp; after a few failures in a row the thread waits longer and longer
(up to ``max_backoff``) and is back to normal after the first good round. Should
the thread end all the same, the bodies handlers read say so instead of
serving the last numbers.
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
from . import diagnosis, processes, snapshot

STARTING = "The GPU sampler is starting."
REQUEST_TTL = 30.0  # seconds a client's requested interval counts after its last poll
FAILURES_BEFORE_BACKOFF = 3  # failed rounds in a row before the sampler waits longer
HUNG_AFTER = 30.0  # seconds past its interval with no new sample: the thread is stuck
LOGGED_ERRORS = 64  # distinct errors remembered (each is logged in full once)


class NvmlReader:
    """What the sampler reads about the GPUs, through gpulab's own NVML binding.

    The sampler's one seam to the outside: it calls nothing of NVML but these
    methods, so a test can hand it a reader that fails and watch it survive.
    """

    def __init__(self):
        self.nvml = None

    def open(self) -> tuple[list[gpus.Device], str]:
        """Every device NVML enumerates, and the driver's version (loads NVML once)."""
        from .nvml import Nvml

        if self.nvml is None:
            self.nvml = Nvml.load()
        return gpus.enumerate_devices(self.nvml), self.nvml.nvmlSystemGetDriverVersion()

    def describe(self, device: gpus.Device) -> None:
        gpus.describe(self.nvml, device)

    def read_fast(self, device: gpus.Device) -> dict:
        return gpus.read_fast(self.nvml, device)

    def read_slow(self, device: gpus.Device, pcie: bool, energy: bool) -> dict:
        return gpus.read_slow(self.nvml, device, pcie, energy)

    def gpu_processes(self, device: gpus.Device) -> list[tuple[int, int | None]]:
        return gpus.gpu_processes(self.nvml, device)

    def close(self, log) -> None:
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError as e:
                log.debug("nvmlShutdown: %s", e)
            self.nvml = None


def describe_error(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


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
    max_backoff = Float(
        60.0,
        config=True,
        help="From the third failed round in a row the sampler's wait doubles with each "
        "failure, up to this many seconds, until a round succeeds.",
    )

    def __init__(self, environ: dict | None = None, reader: NvmlReader | None = None, **kwargs):
        super().__init__(**kwargs)
        self.environ = dict(os.environ if environ is None else environ)
        self.reader = NvmlReader() if reader is None else reader
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._devices: list[gpus.Device] = []
        self._requests: dict[float, float] = {}  # requested interval -> expiry (monotonic)
        self._history: deque = deque()
        self._slow: dict[str, dict] = {}
        self._extra: dict = {}
        self.stats = dict.fromkeys(
            ("ticks", "tick_seconds", "tick_cpu_seconds", "proc_reads", "proc_seconds",
             "proc_cpu_seconds", "errors"), 0
        )  # fmt: skip
        self._state = {"available": False, "reason": "starting", "message": STARTING, "hint": ""}
        # Health: the current error (None when the last round worked), since when, the last
        # good round, failures in a row, the wait they cause; and why the thread ended.
        self._health = {"stale": False, "error": None, "error_since": None, "last_ok": None}
        self._failures = 0
        self._backoff: float | None = None
        self._logged: set[str] = set()
        self._died: str | None = None
        self._next_procs = self._next_slow = 0.0
        self._last = (time.time(), {})  # the last good sample: (timestamp, values)
        self._published = time.monotonic()
        self._status_body = b""
        self._procs: dict = {
            "available": False, "stale": False, "error": None, "timestamp": None,
            "processes": [], "other": [],
        }  # fmt: skip
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
        self.reader.close(self.log)

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
            elif wanted < before and not self._devices:
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
        """The status as the last round left it; stale with the reason if the thread is gone
        or has not sampled for far longer than its interval."""
        if self._trouble() is None:
            return self._status_body
        return json.dumps(self._with_trouble(json.loads(self._status_body))).encode()

    def history(self, since: float | None = None) -> dict:
        with self._lock:
            rows = [r for r in self._history if since is None or r[0] > since]
        return self._with_trouble({**snapshot.history_body(rows, self._devices), **self._common()})

    def processes(self) -> dict:
        return self._with_trouble(dict(self._procs))

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _trouble(self) -> str | None:
        """Why what the last round left is not current although it does not say so."""
        if self._thread is None or self._stop.is_set():
            return None
        if not self._thread.is_alive():
            return f"The GPU sampler stopped: {self._died or 'its thread ended'}"
        waited = time.monotonic() - self._published
        due = self._backoff if self._failures else self.effective_interval()
        if self._devices and waited > (due or 0.0) + HUNG_AFTER:
            return f"The GPU sampler has not sampled for {waited:.0f} s"
        return None

    def _with_trouble(self, body: dict) -> dict:
        trouble = self._trouble()
        if trouble is None:
            return body
        if body.get("stale"):
            trouble = f"{trouble} (before that: {body['error']})"
        else:
            body["error_since"] = body.get("timestamp")
        body.update(stale=True, error=trouble)
        return body

    # -- the thread -------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as e:
            # Not an error of one round (those are caught in _loop): the thread ends.
            # Handlers then answer stale with this reason (see _trouble).
            self._died = describe_error(e)
            self.log.critical("gpulab GPU status: the sampler thread ended", exc_info=True)
            raise

    def _loop(self) -> None:
        from .nvml import NVMLError

        # What reading GPUs and /proc is known to raise: NVML's errors (a GPU lost, the
        # driver reloaded), the OS's (a process gone mid-read), malformed /proc text.
        expected = (NVMLError, OSError, ValueError)
        while not self._stop.is_set():
            try:
                wait = self._step()
            except expected as e:
                wait = self._failed(e, unexpected=False)
            except Exception as e:  # noqa: BLE001 - the sampler must outlive any bug in a read; logged with its traceback, counted and published as stale
                wait = self._failed(e, unexpected=True)
            if wait is None or self._failures:
                self._stop.wait(wait)  # a client asking faster does not cut a backoff short
            else:
                self._wake.wait(wait)
            self._wake.clear()

    def _step(self) -> float | None:
        """One round: find the GPUs (until found), sample them. Seconds to wait after it
        (None: until stopped)."""
        if not self._devices:
            self._setup()
            if not self._devices:
                self._last = (time.time(), {})
                self._ok(self._last[0])
                self._publish(*self._last)
                # No GPU: nothing to sample. A driver does not appear in a running
                # container, but a late device may: look again.
                return 60.0 if self._state["reason"] == "none_allocated" else None
        now = time.monotonic()
        do_procs, do_slow = now >= self._next_procs, now >= self._next_slow
        self._tick(do_procs, do_slow and (self.pcie_throughput or self.energy))
        self._next_procs = now + self.process_interval if do_procs else self._next_procs
        self._next_slow = now + self.slow_interval if do_slow else self._next_slow
        return max(0.0, self.effective_interval() - (time.monotonic() - now))

    def _ok(self, now: float) -> None:
        if self._failures:
            self.log.info(
                "gpulab GPU status: sampling again after %d failed rounds (%s)",
                self._failures,
                self._health["error"],
            )
            self._failures, self._backoff = 0, None
            self._health = {"stale": False, "error": None, "error_since": None, "last_ok": None}
        self._health["last_ok"] = round(now, 3)  # a healthy tick allocates nothing more

    def _failed(self, e: Exception, unexpected: bool) -> float:
        """A round failed: log it (in full once per distinct error), count it, publish
        stale; the seconds to wait before the next try."""
        from .nvml import NVMLError

        error = describe_error(e)
        self.stats["errors"] += 1
        if error not in self._logged:
            if len(self._logged) < LOGGED_ERRORS:
                self._logged.add(error)
            how = "failed unexpectedly" if unexpected else "failed"
            self.log.error("gpulab GPU status: sampling %s: %s", how, error, exc_info=unexpected)
        elif not self._failures:
            self.log.warning("gpulab GPU status: sampling failed again: %s", error)
        self._failures += 1
        now = round(time.time(), 3)
        since = self._health["error_since"] if self._health["stale"] else now
        self._health = {**self._health, "stale": True, "error": error, "error_since": since}
        if not self._devices:  # no GPU found yet: this is why
            why = (
                diagnosis.nvml_failed(str(e))
                if isinstance(e, NVMLError)
                else diagnosis.sampler_failed(error)
            )
            self._state = {"available": False, **why.as_dict()}
        wait = self.effective_interval()
        if self._failures >= FAILURES_BEFORE_BACKOFF:
            grow = 2 ** (self._failures - FAILURES_BEFORE_BACKOFF + 1)
            wait = max(wait, min(self.max_backoff, wait * grow))
        self._backoff = wait
        self._procs = {**self._procs, "stale": True, "error": error}
        self._publish(*self._last)
        return wait

    def _fail(self, why: diagnosis.NoGpu) -> None:
        if self._state.get("message") != why.message:
            self.log.info("gpulab GPU status: %s", why.message)
        self._state = {"available": False, **why.as_dict()}

    def _setup(self) -> None:
        if diagnosis.given_none(self.environ):
            return self._fail(diagnosis.no_gpu_given(self.environ))
        from .nvml import NVMLError_DriverNotLoaded, NVMLError_LibraryNotFound

        try:
            found, driver = self.reader.open()
        except NVMLError_LibraryNotFound:
            return self._fail(diagnosis.without_nvml(self.environ, diagnosis.NO_LIBRARY))
        except NVMLError_DriverNotLoaded:
            return self._fail(diagnosis.without_nvml(self.environ, diagnosis.NOT_LOADED))
        # Any other error goes up to the loop: reported as stale, tried again with backoff.
        self._extra = {"driver_version": driver}
        if not found:
            return self._fail(diagnosis.no_device(self.environ))
        visible = self.environ.get("NVIDIA_VISIBLE_DEVICES")
        cuda = self.environ.get("CUDA_VISIBLE_DEVICES")
        sel = gpus.select(found, visible, self._cuda_uuids(found, cuda))
        if not sel.devices:
            return self._fail(diagnosis.no_device(self.environ, sel.message))
        for d in sel.devices:
            self.reader.describe(d)
        self._devices = sel.devices
        self._state = {"available": True, "reason": None, "message": "", "hint": ""}
        names = ", ".join(f"{d.name} ({d.uuid})" for d in sel.devices)
        self.log.info("gpulab GPU status: sampling %s", names)

    def _cuda_uuids(self, found: list[gpus.Device], cuda: str | None) -> list[str] | None:
        """CUDA_VISIBLE_DEVICES as UUIDs (gpulab_jupyter.nvml.cuda_visible: as the magics
        read it)."""
        from .nvml import cuda_visible

        picked = cuda_visible(cuda, found, index=lambda d: None if d.is_mig else d.physical)
        return None if picked is None else [d.uuid for d in picked]

    def _tick(self, do_procs: bool, do_slow: bool) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        reader, now = self.reader, time.time()
        values = {}
        for d in self._devices:
            row = reader.read_fast(d)
            if do_slow:
                self._slow[d.uuid] = reader.read_slow(d, self.pcie_throughput, self.energy)
            row.update(self._slow.get(d.uuid, {}))
            values[d.uuid] = row
        if do_procs:  # before anything is kept: a failed read fails the whole round
            p0, pc0 = time.perf_counter(), time.thread_time()
            self._read_processes(now)
            # counted in the process reads' own figures, not the tick's
            t0 += time.perf_counter() - p0
            c0 += time.thread_time() - pc0
        hist = {u: tuple(v[k] for k in snapshot.HISTORY_FIELDS) for u, v in values.items()}
        with self._lock:
            self._history.append((now, hist))
            while self._history and self._history[0][0] < now - self.history_seconds:
                self._history.popleft()
        spent, cpu = time.perf_counter() - t0, time.thread_time() - c0
        self.stats["ticks"] += 1
        self.stats["tick_seconds"] += spent
        self.stats["tick_cpu_seconds"] += cpu
        self._ok(now)
        self._last = (now, values)
        self._publish(now, values)

    def _read_processes(self, now: float) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        driver = {d.uuid: self.reader.gpu_processes(d) for d in self._devices}
        local = processes.scan()
        rows, others = processes.attribute(local, driver, {d.uuid: d.minor for d in self._devices})
        index = {d.uuid: i for i, d in enumerate(self._devices)}
        for item in [g for r in rows for g in r["gpus"]] + others:
            item["index"] = index.get(item["uuid"])
        self._procs = {
            "available": True, "stale": False, "error": None, "timestamp": now,
            "processes": rows, "other": others,
        }  # fmt: skip
        self.stats["proc_reads"] += 1
        self.stats["proc_seconds"] += time.perf_counter() - t0
        self.stats["proc_cpu_seconds"] += time.thread_time() - c0

    def _common(self) -> dict:
        return {
            **self._state,
            **self._health,
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
            "sampler": {
                **snapshot.sampler_stats(self.stats, len(self._devices)),
                "failures": self._failures,
                "backoff": self._backoff,
            },
        }
        self._status_body = json.dumps(body).encode()
        self._published = time.monotonic()
