"""The GPU keeper's decision over plain data: which forgotten queued starts are
started again, which entries are cancelled, which idle holders are warned and
stopped while someone waits; and its look against real files (a restart keeps the
reclaim clock)."""

from __future__ import annotations

import json
from pathlib import Path

from gpulab_hub import gpus, hubconfig, settings
from gpulab_hub.gpus import Device, keeper, queue, reclaim, reclaimrecord
from gpulab_hub.gpus.allocator import Holder, Policy, Request
from gpulab_hub.gpus.keeper import Host, HubState, Plan, Server, Start, plan
from gpulab_hub.gpus.reclaimrecord import Warning

NOW = 1_750_000_000.0
MIN = 60.0


def entry(owner, project, count=1, at=NOW - 300, **kw) -> queue.Entry:
    return queue.Entry(Request(owner, project, count, **kw), at)


def hub(**servers: Server) -> HubState:
    """Servers named "owner__project"."""
    keyed = {tuple(k.split("__")): s for k, s in servers.items()}
    return HubState(frozenset(o for o, _ in keyed) | {"zed"}, keyed)


def holding(held: dict[tuple[str, str], int] | None = None, over_budget=(), free: int = 0) -> Host:
    """A host of as many GPUs as ``held`` gives (project: devices it holds), ``free``
    more, the allocator's default policy."""
    devices, holdings = [], {}
    for key, n in (held or {}).items():
        for _ in range(n):
            d = gpu(len(devices))
            devices.append(d)
            holdings[d.uuid] = (Holder(*key, NOW - 3600),)
    devices += [gpu(len(devices) + i) for i in range(free)]
    return Host(tuple(devices), holdings, Policy(), {}, frozenset(over_budget))


def gpu(i: int) -> Device:
    return Device(str(i), f"GPU-{i}", "NVIDIA H100 80GB HBM3", 80 << 30, "9.0", minor=i)


def host_of(*indexes: int) -> gpus.Inventory:
    """The host's inventory: these GPUs (UUIDs GPU-<index>)."""
    return gpus.Inventory(devices=[gpu(i) for i in indexes])


STOPPED = Server()
PENDING = Server(pending="spawn")


def running(idle_min: float) -> Server:
    return Server(running=True, last_activity=NOW - idle_min * MIN)


def test_a_forgotten_queued_start_is_started_again_with_its_gpus_and_last_options():
    e = entry("ann", "train", 2, gpu_type="H100")
    last = {"stack": "pytorch", "gpus": 0, "use_last_good": True}
    state = hub(ann__train=Server(user_options=last), bob__nb=PENDING)
    waiting_bob = entry("bob", "nb")
    assert plan([e, waiting_bob], state, holding(), {}, NOW) == Plan(
        start=(
            Start(
                "ann", "train",
                {"stack": "pytorch", "use_last_good": True, "gpus": 2, "gpu_type": "H100"},
            ),
        ),
    )  # fmt: skip
    mig = entry("ann", "train", 0, mig_profile="1g.10gb")
    assert plan([mig], hub(ann__train=STOPPED), holding(), {}, NOW).start == (
        Start("ann", "train", {"gpus": 0, "mig_profile": "1g.10gb"}),
    )


def test_gone_running_and_failed_restarts_are_cancelled_never_started():
    gone_user = entry("nobody", "p")
    gone_project = entry("zed", "deleted")
    runs = entry("ann", "done")
    failed = entry("bob", "broken", at=NOW - 50)
    state = hub(ann__done=running(1), bob__broken=STOPPED)
    assert plan(
        [gone_user, gone_project, runs, failed], state, holding(), {}, NOW,
        posted={("bob", "broken"): NOW - 50},
    ) == Plan(cancel=(gone_user, gone_project, runs, failed))  # fmt: skip
    # the same project waiting anew (a later entry) is started, not cancelled
    anew = entry("bob", "broken", at=NOW - 5)
    assert plan([anew], state, holding(), {}, NOW, posted={("bob", "broken"): NOW - 50}) == Plan(
        start=(Start("bob", "broken", {"gpus": 1}),)
    )


def test_an_entry_granted_while_nobody_waited_for_it_is_started_to_use_its_gpus():
    e = entry("ann", "train")
    state = hub(ann__train=STOPPED, bob__cancelled=STOPPED)
    cancelled = entry("bob", "cancelled")  # left the queue and holds nothing: not started
    assert plan(
        [], state, holding({("ann", "train"): 1}), {}, NOW, previous=[e, cancelled]
    ) == Plan(start=(Start("ann", "train", {"gpus": 1}),))
    # granted and its own start is under way: nothing to do
    state = hub(ann__train=PENDING)
    assert plan([], state, holding({("ann", "train"): 1}), {}, NOW, previous=[e]) == Plan()


def test_idle_holders_are_warned_while_someone_waits_then_stopped_after_the_grace():
    s = reclaim.Rules(grace=10 * MIN, idle_after=10 * MIN)
    held = holding({("ann", "idle"): 1, ("bob", "busy"): 1, ("cat", "fresh"): 1})
    state = hub(
        ann__idle=running(30), bob__busy=running(0.5), cat__fresh=running(5), dan__q=PENDING
    )
    waiting = [entry("dan", "q")]  # one GPU wanted: one holder chosen
    warned = Warning("ann", "idle", NOW, NOW + 10 * MIN, idle_since=NOW - 30 * MIN)
    assert plan(waiting, state, held, {}, NOW, s) == Plan(
        warn=(warned,), warnings={("ann", "idle"): warned}
    )
    # nine minutes later: still warned, not stopped; the record is unchanged
    later = NOW + 9 * MIN
    assert plan(waiting, state, held, {warned.key: warned}, later, s) == Plan(
        warnings={warned.key: warned}
    )
    # the grace is over and it stayed idle: stopped
    over = NOW + 10 * MIN
    assert plan(waiting, state, held, {warned.key: warned}, over, s) == Plan(
        stop=(("ann", "idle"),), warnings={warned.key: warned}
    )


def test_use_since_the_warning_or_nobody_waiting_withdraws_it():
    warned = Warning("ann", "idle", NOW - 5 * MIN, NOW + 5 * MIN)
    held = holding({("ann", "idle"): 1})
    used = hub(ann__idle=running(1), dan__q=PENDING)
    assert plan([entry("dan", "q")], used, held, {warned.key: warned}, NOW) == Plan()
    idle = hub(ann__idle=running(30))
    assert plan([], idle, held, {warned.key: warned}, NOW) == Plan()
    # a warned project that stopped meanwhile leaves the record
    stopped = hub(ann__idle=STOPPED, dan__q=PENDING)
    assert plan([entry("dan", "q")], stopped, held, {warned.key: warned}, NOW) == Plan()


def test_hub_user_models_become_state():
    users = [
        {"name": "ann", "servers": {
            "a": {"stopped": True, "pending": None, "last_activity": None, "user_options": {}},
            "b": {"stopped": False, "pending": "spawn", "last_activity": None},
            "c": {"stopped": False, "pending": None,
                  "last_activity": "2025-06-15T15:06:40.000000Z", "user_options": {"gpus": 1}},
            "": {"stopped": False, "pending": None},
        }},
        {"name": "bob", "servers": {}},
    ]  # fmt: skip
    assert keeper.state_of(users) == HubState(
        frozenset({"ann", "bob"}),
        {
            ("ann", "a"): Server(),
            ("ann", "b"): Server(pending="spawn"),
            ("ann", "c"): Server(running=True, last_activity=NOW, user_options={"gpus": 1}),
        },
    )


class FakeHub:
    def __init__(self, state: HubState):
        self._state = state
        self.calls: list[tuple] = []

    def state(self) -> HubState:
        return self._state

    def start(self, owner, project, options) -> int:
        self.calls.append(("start", owner, project, dict(options)))
        return 202

    def stop(self, owner, project) -> int:
        self.calls.append(("stop", owner, project))
        return 204


def test_a_look_acts_on_the_files_and_a_new_keeper_keeps_the_clock(tmp_path):
    alloc = tmp_path / "gpu-allocations.json"
    qfile = tmp_path / "gpu-queue.json"
    q = queue.QueueStore(qfile, clock=lambda: NOW - 300)
    q.enqueue(Request("dan", "q", 1))
    q.enqueue(Request("zed", "deleted", 1))
    hold = {"owner": "ann", "project": "idle", "since": NOW - 3600, "reserved": NOW - 3600}
    alloc.write_text(json.dumps({"version": 1, "holdings": {"GPU-1": [hold]}}))
    s = reclaim.Rules(grace=10 * MIN, idle_after=10 * MIN)
    state = hub(ann__idle=running(30), dan__q=STOPPED)
    fake = FakeHub(state)
    k = keeper.Keeper(qfile, alloc, s, inventory=lambda: host_of(1))
    k.look(fake, NOW)
    assert fake.calls == [("start", "dan", "q", {"gpus": 1})]
    assert q.entries() == [entry("dan", "q")]  # the missing project's entry cancelled
    record = reclaimrecord.ReclaimRecord(reclaimrecord.path_of(alloc))
    warned = Warning("ann", "idle", NOW, NOW + 10 * MIN, idle_since=NOW - 30 * MIN)
    assert record.warnings() == {warned.key: warned}
    assert reclaimrecord.stops_of(alloc, "ann") == {"idle": NOW + 10 * MIN}
    # the keeper restarts (a hub restart): the clock is kept, the stop comes on time
    fake = FakeHub(hub(ann__idle=running(40), dan__q=PENDING))
    keeper.Keeper(qfile, alloc, s, inventory=lambda: host_of(1)).look(fake, NOW + 10 * MIN)
    assert fake.calls == [("stop", "ann", "idle")]


def test_the_service_and_its_role_get_the_settings():
    from traitlets.config import Config

    c = Config()
    c.ProjectSpawner.allocations_file = "/srv/x/hub/gpu-allocations.json"
    c.ProjectSpawner.gpu_reclaim_grace = 120.0
    c.ProjectSpawner.gpu_max_per_user = 2
    c.ProjectSpawner.gpu_allowed_types = ["H100"]
    keeper.configure(c, hubconfig.complete(c, settings.DEFAULT))
    (svc,) = c.JupyterHub.services
    # what the service makes of the environment it is given
    k = keeper.Keeper.of(settings.of_service(svc["environment"]))
    assert (k.queue_file, k.allocations_file, k.db_url) == (
        Path("/srv/x/hub/gpu-queue.json"),
        Path("/srv/x/hub/gpu-allocations.json"),
        "sqlite:////srv/gpulab/hub/jupyterhub.sqlite",  # the records folder's: the usage ledger
    )
    assert k.rules == reclaim.Rules(grace=120.0, idle_after=300.0, release_after=1500.0)
    assert (k.usage_window, k.budget_hours) == (604800.0, {})
    # the queue's grant as the spawner's: the reclaim plans with its limits
    assert k.policy == Policy(max_per_user=2, allowed_types=("H100",))
    assert c.JupyterHub.load_roles == [
        {"name": "gpulab-gpu-keeper", "services": ["gpulab-gpu-keeper"],
         "scopes": ["list:users", "read:servers", "start:servers", "delete:servers"]}
    ]  # fmt: skip
    assert "GPULAB_GPU_RECLAIM_IDLE" in settings.variables()


def test_the_home_page_row_of_a_warned_project_says_when_it_stops(tmp_path):
    from test_home_facts import where

    from gpulab_hub.home import facts

    w = where(tmp_path)
    w.allocations_file.parent.mkdir(parents=True)
    stops = NOW + 10 * MIN  # 15:16:40 UTC
    record = reclaimrecord.ReclaimRecord(reclaimrecord.path_of(w.allocations_file))
    record.replace({("dana", "idle"): Warning("dana", "idle", NOW, stops)})
    found = facts.projects(w, "dana", ["idle", "other"])
    assert found["idle"].reclaim_words == (
        "someone is waiting for this GPU: this project stops at 15:16 UTC unless you use it"
    )
    assert found["other"].reclaim_words == ""
    # an idle release (nobody waits) says so, not that someone waits
    record.replace(
        {("dana", "idle"): Warning("dana", "idle", NOW, stops, reclaim.IDLE, NOW - 45 * MIN)}
    )
    found = facts.projects(w, "dana", ["idle"])
    assert found["idle"].reclaim_words == (
        "this project has been idle: this project stops at 15:16 UTC unless you use it"
    )


def test_with_nobody_waiting_and_nobody_warned_the_hub_is_not_asked(tmp_path):
    class Unasked(FakeHub):
        def state(self):
            raise AssertionError("the hub was asked")

    k = keeper.Keeper(tmp_path / "gpu-queue.json", tmp_path / "gpu-allocations.json",
                      reclaim.Rules())  # fmt: skip
    assert k.look(Unasked(hub()), NOW) == Plan()


def test_the_keeper_service_stops_at_the_hubs_first_signal(tmp_path):
    """Started with SIGINT ignored (as a hub in the background starts its services), it
    still stops at JupyterHub's SIGINT, so stopping the hub does not wait 30 s."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from traitlets.config import Config

    c = Config()
    c.ProjectSpawner.allocations_file = str(tmp_path / "gpu-allocations.json")
    site = settings.parse({"GPULAB_GPU_RECLAIM_IDLE": "600", "GPULAB_GPU_RECLAIM_GRACE": "600"})
    env = dict(
        os.environ, JUPYTERHUB_API_TOKEN="t", JUPYTERHUB_API_URL="http://127.0.0.1:9/hub/api",
        **settings.service_env(hubconfig.complete(c, site)),
    )  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulab_hub.gpus.keeper"], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    try:
        time.sleep(3)  # running, a look or two done
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) is not None
    finally:
        proc.kill()
        proc.wait()


# --- budgets: an over-budget user's idle holder is reclaimed first -----------------------


def test_plan_reclaims_the_over_budget_holder_first():
    s = reclaim.Rules(grace=10 * MIN, idle_after=10 * MIN)
    held = {("ann", "long"): 1, ("bob", "spent"): 1}
    state = hub(ann__long=running(120), bob__spent=running(15), dan__q=PENDING)
    waiting = [entry("dan", "q")]
    first = plan(waiting, state, holding(held), {}, NOW, s)
    assert [w.key for w in first.warn] == [("ann", "long")]  # longest idle
    over = plan(waiting, state, holding(held, over_budget={"bob"}), {}, NOW, s)
    assert [w.key for w in over.warn] == [("bob", "spent")]


class BudgetHub(FakeHub):
    def __init__(self, state, groups):
        super().__init__(state)
        self.groups = groups

    def members(self, groups):
        self.calls.append(("members", tuple(groups)))
        return {g: self.groups[g] for g in groups if g in self.groups}


def test_the_keeper_reads_the_ledger_and_the_budgets_and_warns_the_over_budget_holder(tmp_path):
    from gpulab_hub.db import migrate
    from gpulab_hub.gpus.usage import Record, UsageLedger

    alloc = tmp_path / "gpu-allocations.json"
    qfile = tmp_path / "gpu-queue.json"
    ledger = f"sqlite:///{tmp_path / 'jupyterhub.sqlite'}"
    migrate.upgrade(ledger)
    q = queue.QueueStore(qfile, clock=lambda: NOW - 300)
    q.enqueue(Request("dan", "q", 1))
    holds = {
        "GPU-1": [{"owner": "ann", "project": "long", "since": NOW - 7200, "reserved": NOW - 7200}],
        "GPU-2": [{"owner": "bob", "project": "spent", "since": NOW - 600, "reserved": NOW - 600}],
    }  # fmt: skip
    alloc.write_text(json.dumps({"version": 1, "holdings": holds}))
    # bob used 5 GPU-hours yesterday; his group's budget is 4: over. ann (2 h) has 40.
    yesterday = NOW - 86400
    UsageLedger(ledger, clock=lambda: NOW).append(
        [Record("bob", "spent", "GPU-2", "GPU 2", yesterday, yesterday + 5 * 3600)]
    )
    state = hub(ann__long=running(120), bob__spent=running(15), dan__q=PENDING)
    s = reclaim.Rules(grace=10 * MIN, idle_after=10 * MIN)
    k = keeper.Keeper(
        qfile, alloc, s, budget_hours={"*": 40.0, "group:students": 4.0},
        db_url=ledger, usage_window=7 * 86400, inventory=lambda: host_of(1, 2),
    )  # fmt: skip
    fake = BudgetHub(state, {"students": ["bob"]})
    p = k.look(fake, NOW)
    assert [w.key for w in p.warn] == [("bob", "spent")]
    assert ("members", ("students",)) in fake.calls
    # without budgets the longest idle goes first
    reclaimrecord.ReclaimRecord(reclaimrecord.path_of(alloc)).replace({})
    plain = keeper.Keeper(qfile, alloc, s, inventory=lambda: host_of(1, 2))
    assert [w.key for w in plain.look(FakeHub(state), NOW).warn] == [("ann", "long")]


def test_budgets_naming_a_group_let_the_keeper_read_groups():
    from traitlets.config import Config

    c = Config()
    c.ProjectSpawner.gpu_budget_hours = {"group:students": 20, "*": 40}
    keeper.configure(c, hubconfig.complete(c, settings.DEFAULT))
    (svc,) = c.JupyterHub.services
    assert keeper.Keeper.of(settings.of_service(svc["environment"])).budget_hours == {
        "*": 40.0, "group:students": 20.0,
    }  # fmt: skip
    assert "read:groups" in c.JupyterHub.load_roles[0]["scopes"]


# --- idle release: nobody waits -----------------------------------------------------------


def test_idle_release_warns_with_its_own_words_then_stops_and_asks_the_hub_at_most_every_30_s(
    tmp_path,
):
    alloc = tmp_path / "gpu-allocations.json"
    hold = {"owner": "ann", "project": "lunch", "since": NOW - 7200, "reserved": NOW - 7200}
    alloc.write_text(json.dumps({"version": 1, "holdings": {"GPU-1": [hold]}}))
    s = reclaim.Rules(grace=10 * MIN, idle_after=10 * MIN, release_after=45 * MIN)
    k = keeper.Keeper(tmp_path / "gpu-queue.json", alloc, s)
    p = k.look(FakeHub(hub(ann__lunch=running(50))), NOW)
    warned = Warning("ann", "lunch", NOW, NOW + 10 * MIN, reclaim.IDLE, NOW - 50 * MIN)
    assert p.warn == (warned,)
    assert reclaimrecord.words_of(warned, NOW + 4 * MIN) == (
        "this project has been idle for 54 min: this project stops in 6 min unless you use it "
        "(its files are kept)"
    )
    fake = FakeHub(hub(ann__lunch=running(60)))
    k.look(fake, NOW + 10 * MIN)
    assert fake.calls == [("stop", "ann", "lunch")]
    # a holder idle 20 min: looked at, not warned; the hub is not asked again for 30 s
    alloc.write_text(json.dumps({"version": 1, "holdings": {"GPU-1": [hold]}}))
    reclaimrecord.ReclaimRecord(reclaimrecord.path_of(alloc)).replace({})
    k = keeper.Keeper(tmp_path / "gpu-queue.json", alloc, s)
    assert k.look(FakeHub(hub(ann__lunch=running(20))), NOW) == Plan()

    class Unasked(FakeHub):
        def state(self):
            raise AssertionError("the hub was asked")

    assert k.look(Unasked(hub()), NOW + 20) == Plan()
    assert k.look(FakeHub(hub(ann__lunch=running(50))), NOW + 30).warn != ()


def test_a_record_written_before_reasons_still_reads(tmp_path):
    path = reclaimrecord.path_of(tmp_path / "gpu-allocations.json")
    old = {"owner": "ann", "project": "p", "warned_at": NOW, "stops_at": NOW + 600}
    path.write_text(json.dumps({"version": 1, "warnings": [old]}))
    (w,) = reclaimrecord.ReclaimRecord(path).warnings().values()
    assert (w.reason, w.idle_since) == (reclaim.WAITING, None)
    assert reclaimrecord.words_of(w, NOW) == (
        "someone is waiting for this GPU: this project stops in 10 min unless you use it "
        "(its files are kept)"
    )


def test_settings_set_after_gpulabs_reach_the_service_through_finish():
    """An admin's lines (or jupyterhub_config.d) after hubconfig.apply: hubconfig.finish,
    the config file's last step, hands them to the keeper in place of the first ones."""
    from traitlets.config import Config

    c = Config()
    hubconfig.apply(c, {"GPULAB_HOME": "/srv/x", "GPULAB_HUB_IP": "127.0.0.1"}, images_dir="/i")
    before = [s["name"] for s in c.JupyterHub.services]
    c.ProjectSpawner.gpu_idle_release = 3600.0  # the admin's line
    c.ProjectSpawner.gpu_budget_hours = {"group:students": 20}
    hubconfig.finish(c)
    assert [s["name"] for s in c.JupyterHub.services] == before  # replaced, not added
    (svc,) = [s for s in c.JupyterHub.services if s["name"] == keeper.SERVICE]
    k = keeper.Keeper.of(settings.of_service(svc["environment"]))
    assert k.rules.release_after == 3600.0
    assert k.budget_hours == {"group:students": 20.0}
    (role,) = [r for r in c.JupyterHub.load_roles if r["name"] == keeper.SERVICE]
    assert "read:groups" in role["scopes"]
