"""The GPU keeper: a JupyterHub service that keeps the GPU queue's promises the hub
alone cannot.

1. A queued start survives a hub restart. The queue file keeps a waiting start's
   entry, but JupyterHub forgets the pending spawn. Every ``EVERY`` seconds the
   keeper reads the queue, and for an entry whose server is neither running nor
   pending it asks the hub to start that project again (with the GPUs the entry
   asks for), so the spawner finds its entry and waits its turn in place
   (``QueueStore.enqueue`` keeps ``enqueued_at``). An entry granted while nobody
   waited for it (it left the queue, its project holds the GPUs, its server is
   stopped) is started the same way and keeps those GPUs. An entry whose user or
   project no longer exists, whose project runs (its start ended), or whose
   restart by the keeper failed before it could wait again, is cancelled. Nothing
   that is not (or was not, one look ago) in the queue is ever started.
2. Idle GPUs come back while someone waits, for a start that gets them:
   ``reclaim.decide`` on what the hub knows, choosing only the idle holders whose
   stops the queue's own grant turns into grants (``queue.reclaim_for`` over the
   host's devices, the allocation record and the allocator's policy: per-user and
   per-project limits, budgets, fair-share order), one holder per grant (a holder
   warned or stopping counts toward the start it is reclaimed for). The host's
   devices are NVML's, read by the keeper itself. A holder's ``idle_since`` is
   JupyterHub's ``last_activity`` of its server, which gpulab's project servers
   keep fresh while a kernel is busy, a job runs or a GPU of the project was busy
   in the last minute
   (``gpulab_jupyter/activity.py``) and the SSH gateway keeps fresh while an SSH
   session is open (ssh/gateway.py). Over-budget users' holders go first: the
   usage ledger's hours over the window against ``gpu_budget_hours`` (group
   members asked of the hub). Warnings are kept in the reclaim record
   (``reclaimrecord.py``) so a restart keeps the clock; the home page and the
   project's JupyterLab (``reclaimapi.py``) show them.
3. Idle release (``gpu_idle_release``, 0: off): a holder idle that long is warned
   and stopped after the grace even when nobody waits.

``plan`` is the decision, pure; ``look`` reads the files and the hub and acts.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from urllib.parse import quote

from sqlalchemy.exc import SQLAlchemyError

from gpulab_hub import blocking, gpus, jsonfile, settings
from gpulab_hub.gpus import allocator, queue, reclaim, reclaimrecord, usage
from gpulab_hub.gpus.reclaimrecord import Warning
from gpulab_hub.layout import GPU_USAGE_RETENTION_DAYS, GPU_USAGE_WINDOW_S

SERVICE = "gpulab-gpu-keeper"
# list users and their servers (stopped ones included), start and stop servers
SCOPES = ["list:users", "read:servers", "start:servers", "delete:servers"]
EVERY = 2.0  # seconds between looks
RELEASE_EVERY = 30.0  # seconds between looks for idle release alone (nobody waits or warned)
MAX_PAGES = 1000  # pages of users read per look (200 users a page)
INVENTORY_TTL = 300.0  # seconds the host's GPU inventory (NVML) is reused
GPU_OPTIONS = ("gpus", "gpu_type", "mig_profile")
LOG = logging.getLogger("gpulab.gpu-keeper")

Key = tuple[str, str]


@dataclass(frozen=True)
class Server:
    """A project's server as the hub reports it."""

    running: bool = False  # started and no action pending
    pending: str = ""  # "spawn", "stop", ...: an action under way
    last_activity: float | None = None  # epoch seconds
    user_options: Mapping = field(default_factory=dict)


@dataclass(frozen=True)
class HubState:
    users: frozenset[str]
    servers: Mapping[Key, Server]  # every project, stopped ones included


@dataclass(frozen=True)
class Host:
    """What the queue's grant decides on: the host's devices, who holds which (the
    allocation record), the allocator's policy, and the fair-share standing (GPU-hours
    per user over the window; users over their budget)."""

    devices: tuple[gpus.Device, ...] = ()
    holdings: allocator.Held = field(default_factory=dict)
    policy: allocator.Policy = allocator.Policy()
    usage: Mapping[str, float] = field(default_factory=dict)
    over_budget: frozenset[str] = frozenset()

    def held(self) -> dict[Key, int]:
        """Devices each project holds."""
        out: dict[Key, int] = {}
        for hs in self.holdings.values():
            for h in hs:
                out[h.key] = out.get(h.key, 0) + 1
        return out


@dataclass(frozen=True)
class Start:
    owner: str
    project: str
    options: Mapping

    @property
    def key(self) -> Key:
        return (self.owner, self.project)


@dataclass(frozen=True)
class Plan:
    start: tuple[Start, ...] = ()
    cancel: tuple[queue.Entry, ...] = ()  # out of the queue (only if it is still this entry)
    stop: tuple[Key, ...] = ()  # idle holders whose grace is over
    warn: tuple[Warning, ...] = ()  # warned now
    warnings: Mapping[Key, Warning] = field(default_factory=dict)  # the record after this look


def options_for(entry: queue.Entry, last: Mapping | None) -> dict:
    """The spawn options that ask for what ``entry`` asks for: its GPUs, and the
    project's last other options (``stack``, ``use_last_good``) where still valid."""
    from gpulab_hub.projects import options

    r = entry.request
    gpu = {"gpus": r.count}
    if r.gpu_type:
        gpu["gpu_type"] = r.gpu_type
    if r.mig_profile:
        gpu["mig_profile"] = r.mig_profile
    kept = {k: v for k, v in (last or {}).items() if k in options.ALLOWED and k not in GPU_OPTIONS}
    try:
        return options.validate({**kept, **gpu})
    except options.OptionsError:
        return options.validate(gpu)


def plan(
    entries: Sequence[queue.Entry],
    hub: HubState,
    host: Host,
    warnings: Mapping[Key, Warning],
    now: float,
    rules: reclaim.Rules = reclaim.Rules(),
    previous: Sequence[queue.Entry] = (),
    posted: Mapping[Key, float] = {},  # noqa: B006 (read only)
) -> Plan:
    """What to do now.

    ``entries``: the queue now; ``previous``: the queue one look ago; ``host``: the
    devices, the allocation record, the policy and the fair-share standing the
    queue's grant decides on (over-budget users' idle holders are reclaimed first);
    ``warnings``: the reclaim record; ``posted``: projects the keeper started again,
    by the ``enqueued_at`` of the entry it started them for.
    """
    held = host.held()
    start: list[Start] = []
    cancel: list[queue.Entry] = []
    waiting: list[queue.Entry] = []  # starts waiting now (or started again to wait)
    for e in entries:
        srv = hub.servers.get(e.key)
        if e.owner not in hub.users or srv is None:
            cancel.append(e)  # the user or the project is gone
        elif srv.pending:
            waiting.append(e)
        elif srv.running:
            cancel.append(e)  # its start ended: it runs
        elif posted.get(e.key) == e.enqueued_at:
            cancel.append(e)  # started again, and that start failed before it could wait
        else:
            start.append(Start(e.owner, e.project, options_for(e, srv.user_options)))
            waiting.append(e)
    now_waiting = {e.key for e in entries}
    for e in previous:  # granted with nobody to use its GPUs (its start was forgotten)
        srv = hub.servers.get(e.key)
        if (
            e.key not in now_waiting
            and held.get(e.key)
            and e.owner in hub.users
            and srv is not None
            and not (srv.running or srv.pending)
            and posted.get(e.key) != e.enqueued_at
        ):
            start.append(Start(e.owner, e.project, options_for(e, srv.user_options)))

    holders = []
    stopping = []  # their GPUs come back without a reclaim
    for key, n in sorted(held.items()):
        srv = hub.servers.get(key)
        if srv is not None and srv.pending == "stop":
            stopping.append(key)
        if srv is None or not srv.running or srv.last_activity is None:
            continue  # starting, stopping, or no activity known: not judged idle
        w = warnings.get(key)
        holders.append(
            reclaim.Facts(
                *key, gpus=n,
                gpu_util=0.0,  # a busy GPU is in last_activity (activity.py)
                idle_since=srv.last_activity,
                warned_at=w.warned_at if w else None,
            )
        )  # fmt: skip
    needed = queue.reclaim_for(
        waiting, list(host.devices), host.holdings, host.policy, host.usage,
        host.over_budget, stopping,
    )  # fmt: skip
    d = reclaim.decide(holders, needed if waiting else 0, now, rules, host.over_budget)
    dropped = {f.key for f in d.withdraw}
    judged = {h.key for h in holders}
    after = {k: w for k, w in warnings.items() if k in judged and k not in dropped}
    warn = tuple(
        Warning(
            f.owner, f.project, now, now + rules.grace,
            reclaim.IDLE if f.key in d.released else reclaim.WAITING, f.idle_since,
        )
        for f in d.warn
    )  # fmt: skip
    after.update((w.key, w) for w in warn)
    return Plan(
        start=tuple(start),
        cancel=tuple(cancel),
        stop=tuple(f.key for f in d.stop),
        warn=warn,
        warnings=after,
    )


# --- the hub's REST API -------------------------------------------------------------


def _epoch(iso: str | None) -> float | None:
    if not iso:
        return None
    return datetime.fromisoformat(iso).timestamp()


def state_of(users: Sequence[Mapping]) -> HubState:
    """The hub's user models (with stopped servers) as ``HubState``."""
    servers: dict[Key, Server] = {}
    for u in users:
        for name, s in (u.get("servers") or {}).items():
            if not name:
                continue  # the default server: never a gpulab project
            pending = s.get("pending") or ""
            servers[(u["name"], name)] = Server(
                running=not s.get("stopped", False) and not pending,
                pending=pending,
                last_activity=_epoch(s.get("last_activity")),
                user_options=s.get("user_options") or {},
            )
    return HubState(frozenset(u["name"] for u in users), servers)


class Hub:
    """The hub's REST API, with the service's token."""

    def __init__(self, api_url: str, token: str, timeout: float = 10.0):
        import requests

        self.api_url = api_url.rstrip("/")
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"token {token}"
        self.timeout = timeout

    def _server(self, owner: str, project: str) -> str:
        return f"{self.api_url}/users/{quote(owner, safe='')}/servers/{quote(project, safe='')}"

    def state(self) -> HubState:
        users: list[Mapping] = []
        offset = 0
        for _ in range(MAX_PAGES):
            r = self.session.get(
                f"{self.api_url}/users",
                params={"include_stopped_servers": "1", "offset": offset, "limit": 200},
                headers={"Accept": "application/jupyterhub-pagination+json"},
                timeout=self.timeout,
            )
            r.raise_for_status()
            page = r.json()
            users += page["items"]
            nxt = (page.get("_pagination") or {}).get("next")
            if not nxt:
                break
            offset = nxt["offset"]
        return state_of(users)

    def start(self, owner: str, project: str, options: Mapping) -> int:
        r = self.session.post(
            self._server(owner, project), json=dict(options), timeout=self.timeout
        )
        return r.status_code

    def stop(self, owner: str, project: str) -> int:
        return self.session.delete(self._server(owner, project), timeout=self.timeout).status_code

    def members(self, groups: Sequence[str]) -> dict[str, list[str]]:
        """The users of each of ``groups`` (one a budget names); a group the hub does
        not have has none."""
        out: dict[str, list[str]] = {}
        for g in groups:
            r = self.session.get(f"{self.api_url}/groups/{quote(g, safe='')}", timeout=self.timeout)
            if r.status_code == 404:
                continue
            r.raise_for_status()
            out[g] = [u for u in r.json().get("users") or [] if isinstance(u, str)]
        return out


# --- one look -----------------------------------------------------------------------


def policy_of(fields: Sequence[tuple[str, object]]) -> allocator.Policy:
    """``allocator.Policy`` from the layout's ``allocation_policy``."""
    return allocator.Policy(**dict(fields))


@dataclass
class Keeper:
    """What the keeper reads and remembers between looks."""

    queue_file: Path
    allocations_file: Path
    rules: reclaim.Rules
    previous: list[queue.Entry] = field(default_factory=list)
    posted: dict[Key, float] = field(default_factory=dict)
    budget_hours: Mapping[str, float] = field(default_factory=dict)  # gpu_budget_hours
    db_url: str | None = None  # the hub's database: the usage ledger (None: no fair share)
    usage_window: float = GPU_USAGE_WINDOW_S
    usage_retention: float = GPU_USAGE_RETENTION_DAYS * 24 * 3600.0
    release_looked: float = float("-inf")  # when the hub was last asked for idle release
    policy: allocator.Policy = allocator.Policy()  # the spawner's (gpu_* traits)
    inventory: Callable[[], gpus.Inventory] = gpus.inventory  # the host's GPUs (NVML)
    _devices: tuple[float, tuple[gpus.Device, ...]] | None = field(default=None, repr=False)

    @classmethod
    def of(cls, s: settings.Settings) -> Keeper:
        """The keeper of the hub whose settings are ``s`` (complete with the layout)."""
        where, g = s.layout, s.gpus
        return cls(
            queue_file=where.queue_file,
            allocations_file=where.allocations_file,
            rules=reclaim.Rules(
                grace=g.reclaim_grace, idle_after=g.reclaim_idle, release_after=g.idle_release
            ),
            budget_hours=dict(where.budget_hours),
            db_url=where.db_url,
            usage_window=where.usage_window,
            usage_retention=where.usage_retention,
            policy=policy_of(where.allocation_policy),
        )

    def devices(self) -> tuple[gpus.Device, ...]:
        """The host's devices, read at most every INVENTORY_TTL seconds."""
        now = time.monotonic()
        if self._devices is None or now - self._devices[0] > INVENTORY_TTL:
            inv = self.inventory()
            if inv.problem:
                LOG.warning("GPU keeper: no GPUs seen (%s): nothing is reclaimed", inv.problem)
            self._devices = (now, tuple(inv.devices))
        return self._devices[1]

    def fair_share(
        self, hub: Hub, now: float, held: allocator.Held
    ) -> tuple[dict[str, float], frozenset[str]]:
        """GPU-hours per user over the window (holdings under way counted), and the
        users who have used their GPU budget up: what the queue's order reads."""
        from types import SimpleNamespace

        from gpulab_hub.gpus import waiting

        if self.db_url is None:
            return {}, frozenset()
        ledger = usage.UsageLedger(self.db_url, retention=self.usage_retention, log=LOG)
        hours = ledger.hours_by_user(self.usage_window, now=now, held=held)
        if not self.budget_hours:
            return hours, frozenset()
        named = SimpleNamespace(gpu_budget_hours=dict(self.budget_hours))
        groups = waiting.budget_groups(named)
        budgets = waiting.budgets_of(named, hub.members(groups) if groups else {})
        return hours, budgets.over(hours)

    def host(self, hub: Hub, now: float, held: allocator.Held, waiting: bool) -> Host:
        """What the queue's grant decides on now (``waiting``: whether starts wait;
        without, only the holdings matter)."""
        hours, over = self.fair_share(hub, now, held)
        return Host(self.devices() if waiting else (), held, self.policy, hours, over)

    def look(self, hub: Hub, now: float) -> Plan:
        """Read the queue, the allocation record, the reclaim record and the hub; act."""
        q = queue.QueueStore(self.queue_file)
        entries = q.entries() if self.queue_file.exists() else []
        record = reclaimrecord.ReclaimRecord(reclaimrecord.path_of(self.allocations_file))
        warnings = record.warnings()
        held = (
            allocator.AllocationStore(self.allocations_file).holdings()
            if self.allocations_file.exists()
            else {}
        )
        releasing = (
            self.rules.release_after > 0 and held and now - self.release_looked >= RELEASE_EVERY
        )
        if not (entries or self.previous or warnings or releasing):
            return Plan()  # nobody waits, nobody warned, nothing to release: the hub not asked
        self.release_looked = now
        state, host = hub.state(), self.host(hub, now, held, bool(entries))
        p = plan(entries, state, host, warnings, now, self.rules, self.previous, self.posted)
        self.previous = entries
        for e in p.cancel:
            if cancel_if_same(q, e):
                LOG.info("GPU queue: %s/%s cancelled (project gone, running, or its "
                         "start failed)", *e.key)  # fmt: skip
        self.posted = {k: t for k, t in self.posted.items() if k in {e.key for e in entries}}
        for s in p.start:
            status = hub.start(s.owner, s.project, s.options)
            LOG.info("GPU queue: started %s/%s again (%s): HTTP %s", *s.key, s.options, status)
            if status in (201, 202):
                mine = [e for e in entries if e.key == s.key]
                self.posted[s.key] = mine[0].enqueued_at if mine else -1.0
        record.replace(dict(p.warnings))  # before any stop: the clock survives a restart
        for w in p.warn:
            why = "idle too long" if w.reason == reclaim.IDLE else "idle while starts wait"
            LOG.info("GPU reclaim: %s/%s is %s: warned, stops at %s", *w.key, why,
                     time.strftime("%H:%M:%S", time.localtime(w.stops_at)))  # fmt: skip
        for key in p.stop:
            status = hub.stop(*key)
            LOG.info("GPU reclaim: %s/%s stopped (idle through its grace): HTTP %s", *key, status)
        return p


def cancel_if_same(q: queue.QueueStore, e: queue.Entry) -> bool:
    """Take ``e`` out of the queue unless its project waits anew (another entry)."""
    with q.locked():
        entries = q._read()
        kept = [x for x in entries if x != e]
        if len(kept) != len(entries):
            q._write(kept)
        return len(kept) != len(entries)


def main() -> None:
    """The service's command (environment: the hub's API and token, and the settings
    ``configure`` passes)."""
    import requests

    signal.signal(signal.SIGINT, signal.default_int_handler)  # stop at the hub's first signal
    logging.basicConfig(
        level=logging.INFO, format="[%(levelname)s %(asctime)s %(name)s] %(message)s"
    )
    env = os.environ
    keeper = Keeper.of(settings.of_service(env))
    hub = Hub(env["JUPYTERHUB_API_URL"], env["JUPYTERHUB_API_TOKEN"])
    while True:
        try:
            keeper.look(hub, time.time())
        except (requests.RequestException, queue.QueueError, allocator.AllocationError,
                jsonfile.RecordError, blocking.Busy, OSError, ValueError,
                KeyError, SQLAlchemyError) as e:  # fmt: skip
            LOG.warning("GPU keeper: this look failed, trying again: %s", e)
        time.sleep(EVERY)


def configure(c, s: settings.Settings) -> None:
    """The keeper service, its role, and its settings (``s``, complete with the
    layout: what ``ProjectSpawner``'s traits in ``c`` say now, in its environment).
    Called again, it replaces its own service and role in place:
    ``hubconfig.finish`` calls it once more after the admin's lines and
    ``jupyterhub_config.d``, so those reach the service too."""
    import sys

    from gpulab_hub.gpus import waiting

    Keeper.of(s)  # checked now: a setting out of range stops the hub's start
    # reading the members of the groups budgets name
    groups = any(k.startswith(waiting.GROUP) for k, _ in s.layout.budget_hours)
    scopes = SCOPES + (["read:groups"] if groups else [])
    service = {
        "name": SERVICE,
        "command": [sys.executable, "-m", "gpulab_hub.gpus.keeper"],
        "environment": settings.service_env(s),
    }
    role = {"name": SERVICE, "scopes": scopes, "services": [SERVICE]}
    c.JupyterHub.services = _put(
        c.JupyterHub.services if "services" in c.JupyterHub else [], service
    )
    roles = c.JupyterHub.load_roles if "load_roles" in c.JupyterHub else []
    c.JupyterHub.load_roles = _put(roles, role)


def _put(entries: list, entry: dict) -> list:
    """``entries`` with ``entry`` in place of the one of its name (else at the end)."""
    names = [e.get("name") for e in entries]
    if entry["name"] in names:
        i = names.index(entry["name"])
        return [*entries[:i], entry, *entries[i + 1 :]]
    return [*entries, entry]


if __name__ == "__main__":
    main()
