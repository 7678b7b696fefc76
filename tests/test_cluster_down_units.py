"""``gpulab down`` and ``gpulab status`` on a Slurm cluster, without one: which jobs are
this hub's (cluster/hubjobs.py) and what the command says, with a recording runner for
Slurm's commands. Another gpulab's jobs on the same cluster (another prefix), the
doctor's probes and the user's own jobs are never cancelled. The real command against
a real cluster: tests/test_cluster_spawner.py (its last test).
"""

from __future__ import annotations

import os
import subprocess
from types import SimpleNamespace

import pytest
from dockerspawner import DockerSpawner

from gpulab_hub.cli import cluster as cli_cluster
from gpulab_hub.cluster import hubjobs, jobs, slurm

ESCAPE = DockerSpawner._escape
UID = 4321
MULTI = "20261123-141502-a1b2"
LONG_OWNER = "ab." * 21 + "x"  # 64 characters, each dot escaped to three


def line(job_id: int, name: str, state: str = "RUNNING", node: str = "n1") -> str:
    reason, node = ("Resources", "") if state == "PENDING" else ("None", node)
    return f"{job_id}|{state}|{reason}|gpu|100|gres:gpu:h200:1|{node}|{name}"


class Cluster:
    """A recording runner standing in for squeue and scancel: ``jobs`` maps job id to its
    squeue line; scancel makes a job COMPLETING (``ends_after`` squeue calls later it is
    gone, as a COMPLETING job is) or is refused for the ids in ``refuse``."""

    def __init__(self, lines: list[str], ends_after: int = 1, refuse=(), silent=False):
        self.jobs = {int(x.split("|")[0]): x for x in lines}
        self.ends_after, self.refuse, self.silent = ends_after, set(refuse), silent
        self.calls: list[list[str]] = []
        self.envs: list[dict] = []
        # job -> squeue calls left until it is gone (a COMPLETING job ends by itself)
        self.cancelled = {j: ends_after for j, x in self.jobs.items() if "|COMPLETING|" in x}

    def __call__(self, argv, **kw):
        self.calls.append(argv)
        self.envs.append(kw["env"])
        name = os.path.basename(argv[0])
        if self.silent:
            raise subprocess.TimeoutExpired(argv, kw["timeout"])
        if name == "scancel":
            job = int(argv[-1])
            if job in self.refuse:
                return subprocess.CompletedProcess(argv, 1, "", "scancel: error: Access denied")
            self.cancelled[job] = self.ends_after
            fields = self.jobs[job].split("|")
            fields[1] = "COMPLETING"
            self.jobs[job] = "|".join(fields)
            return subprocess.CompletedProcess(argv, 0, "", "")
        assert name == "squeue", argv
        for job, left in list(self.cancelled.items()):
            if left <= 0:
                self.jobs.pop(job, None)
                del self.cancelled[job]
            else:
                self.cancelled[job] = left - 1
        text = "".join(x + "\n" for x in self.jobs.values())
        return subprocess.CompletedProcess(argv, 0, text, "")

    def scancelled(self) -> list[int]:
        return [int(a[-1]) for a in self.calls if os.path.basename(a[0]) == "scancel"]


def client(runner: Cluster) -> slurm.Slurm:
    c = slurm.Slurm(conf="/etc/slurm-lab/slurm.conf", path="/usr/bin:/bin", run=runner)
    c.command = lambda name: f"/usr/bin/{name}"
    return c


# --- which jobs are this hub's --------------------------------------------------------


@pytest.mark.parametrize(
    "name,found",
    [
        ("gpulab-alice--demo", ("alice", "demo", "")),
        ("gpulab-bob-2ecat--vision-2d2", ("bob.cat", "vision-2", "")),  # bob.cat/vision-2
        ("gpulab-alice-2d--demo", ("alice-", "demo", "")),
        (f"gpulab-alice--demo-job-{MULTI}", ("alice", "demo", MULTI)),
        # another gpulab's jobs on the same cluster: other prefixes
        ("gpulab2-alice--demo", None),
        ("gpulab-lab2-alice--demo", None),  # prefix "gpulab-lab2"
        ("gpulab-a-c3--demo", None),  # prefix "gpulab-a", user "c3": not UTF-8 read as ours
        ("xgpulab-alice--demo", None),
        # gpulab's other jobs, the user's own, names that do not read back
        ("gpulab-doctor", None),
        ("gpulab-alice", None),
        ("gpulab-alice--Demo", None),
        ("gpulab-alice--demo-job-1", None),
        ("gpulab-alice--demo--x", None),
        ("gpulab-bob-2Ecat--demo", None),
        ("gpulab-al-zzice--demo", None),
        ("gpulab-alice--2d2ddemo", None),  # project "--demo": not a project name
        ("gpulab-alice--demo ", None),
        ("train.sh", None),
    ],
)  # fmt: skip
def test_a_job_is_this_hubs_only_by_the_exact_name_the_hub_gives(name, found):
    assert hubjobs.parse_name(name, "gpulab", ESCAPE) == found
    if found:  # the name the hub gives that project (and job)
        owner, project, multi = found
        given = hubjobs.container_name("gpulab", ESCAPE, owner, project)
        assert (jobs.container_name(given, multi) if multi else given) == name


def test_a_recorded_multinode_job_counts_by_its_given_name_even_cut_short():
    owner = LONG_OWNER
    given = jobs.container_name(hubjobs.container_name("gpulab", ESCAPE, owner, "demo"), MULTI)
    assert len(given) > jobs.JOB_NAME_MAX
    cut = given[: jobs.JOB_NAME_MAX]
    queue = slurm.parse_squeue(line(30, cut) + "\n" + line(31, cut))
    recorded = {30: (owner, "demo", MULTI)}
    (found,) = hubjobs.select(queue, "gpulab", ESCAPE, recorded)  # 31: not recorded
    assert (found.job.id, found.what) == (30, f"job {MULTI} of project {owner}/demo")
    # A recorded id whose name is not the given one (Slurm reused the id): not ours.
    assert hubjobs.select(queue[:1], "gpulab", ESCAPE, {30: ("bob", "demo", MULTI)}) == []


# --- gpulab down ------------------------------------------------------------------------

OURS = [
    line(12, "gpulab-alice--demo"),
    line(13, "gpulab-bob-2ecat--vision-2d2", "PENDING"),
    line(14, f"gpulab-alice--demo-job-{MULTI}", node="n[1-2]"),
]
THEIRS = [
    line(20, "gpulab2-alice--demo"),
    line(21, "gpulab-lab2-alice--demo"),
    line(22, "gpulab-doctor"),
    line(23, "my-training-run"),
]


def hub(runner: Cluster, records_dir) -> SimpleNamespace:
    """What stop_jobs and show_jobs use of the hub's ProjectSlurmSpawner."""
    return SimpleNamespace(slurm=client(runner), prefix="gpulab", escape=ESCAPE,
                           records_dir=str(records_dir))  # fmt: skip


def test_down_cancels_this_hubs_jobs_and_no_others(tmp_path, capsys):
    runner = Cluster(OURS + THEIRS)
    cli_cluster.stop_jobs(hub(runner, tmp_path), UID)
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "Stopped project alice/demo on the cluster (Slurm job 12)",
        "Stopped project bob.cat/vision-2 on the cluster (Slurm job 13)",
        f"Stopped job {MULTI} of project alice/demo on the cluster (Slurm job 14)",
    ]
    assert err == ""
    assert runner.scancelled() == [12, 13, 14]
    assert sorted(runner.jobs) == [20, 21, 22, 23]  # the others' jobs run on
    # Only the hub's user's jobs are asked for; only Slurm's settings reach Slurm.
    squeues = [a for a in runner.calls if a[0].endswith("squeue")]
    assert all(f"--user={UID}" in a for a in squeues)
    assert all(set(env) == {"PATH", "LC_ALL", "SLURM_CONF"} for env in runner.envs)


def test_down_waits_for_each_job_to_end_and_says_what_it_could_not_stop(tmp_path, capsys):
    runner = Cluster(OURS[:2] + [line(15, "gpulab-carol--demo", "COMPLETING")],
                     ends_after=2, refuse={13})  # fmt: skip
    cli_cluster.stop_jobs(hub(runner, tmp_path), UID)
    out, err = capsys.readouterr()
    assert runner.scancelled() == [12, 13]  # 15 is ending already: waited for, not cancelled
    assert out.splitlines() == [
        "Stopped project alice/demo on the cluster (Slurm job 12)",
        "Stopped project carol/demo on the cluster (Slurm job 15)",
    ]
    assert err == (
        "gpulab: could not stop project bob.cat/vision-2 on the cluster (Slurm job 13): "
        "Slurm's scancel failed: scancel: error: Access denied\n"
    )
    # A job that does not end in time is named with its state.
    runner = Cluster(OURS[:1], ends_after=10**6)
    cli_cluster.stop_jobs(hub(runner, tmp_path), UID, timeout=0.3)
    assert capsys.readouterr().err == (
        "gpulab: project alice/demo: Slurm job 12 was cancelled and is still COMPLETING "
        "after 0 s; its node's Epilog removes the container when it ends (squeue shows it).\n"
    )


def test_down_goes_on_when_slurm_does_not_answer(tmp_path, capsys):
    runner = Cluster(OURS, silent=True)
    cli_cluster.stop_jobs(hub(runner, tmp_path), UID)
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(
        "gpulab: the cluster's Slurm does not answer (Slurm's squeue did not answer in 30 s"
    )
    assert "Run gpulab down again once it answers" in err
    assert "scancel (named gpulab-<user>--<project>)" in err
    assert runner.scancelled() == []


def test_down_finds_the_hubs_recorded_multinode_jobs(tmp_path, capsys):
    owner = LONG_OWNER
    given = jobs.container_name(hubjobs.container_name("gpulab", ESCAPE, owner, "demo"), MULTI)
    record = jobs.record_of(tmp_path)
    with record.locked():
        record._write({"31": {"owner": owner, "project": "demo", "job": MULTI, "addresses": []}})
    runner = Cluster([line(31, given[: jobs.JOB_NAME_MAX])])
    cli_cluster.stop_jobs(hub(runner, tmp_path), UID)
    assert capsys.readouterr().out == (
        f"Stopped job {MULTI} of project {owner}/demo on the cluster (Slurm job 31)\n"
    )


# --- gpulab status -----------------------------------------------------------------------


def test_status_lists_this_hubs_jobs_with_their_state_and_node(tmp_path, capsys):
    runner = Cluster(OURS + THEIRS)
    assert cli_cluster.show_jobs(hub(runner, tmp_path), UID)
    assert capsys.readouterr().out.splitlines() == [
        "cluster: 3 job(s) of this hub",
        "  alice/demo: RUNNING, running on node n1 (Slurm job 12)",
        "  bob.cat/vision-2: PENDING, waiting for a GPU: next in line (Slurm job 13)",
        f"  alice/demo job {MULTI}: RUNNING, running on node n[1-2] (Slurm job 14)",
    ]
    assert runner.scancelled() == []
    assert not cli_cluster.show_jobs(hub(Cluster(OURS, silent=True), tmp_path), UID)
    assert capsys.readouterr().out.startswith("cluster: Slurm does not answer: ")


def test_down_stops_even_when_the_hubs_configuration_is_broken(tmp_path, monkeypatch, capsys):
    """A jupyterhub_config.py that raises must not keep `gpulab down` from stopping."""
    from gpulab_hub import cli

    def broken():
        raise SyntaxError("invalid syntax (jupyterhub_config.py, line 3)")

    monkeypatch.setattr(cli_cluster, "hub_spawner", broken)
    monkeypatch.setattr(cli.host, "stop_dockerd", lambda hub_dir: False)
    monkeypatch.setattr(cli.host.Docker, "reachable", lambda self: False)
    env = {**os.environ, "GPULAB_HOME": str(tmp_path)}
    assert cli.cmd_down(SimpleNamespace(), env) == 0
    err = capsys.readouterr().err
    assert "Could not read the hub's configuration (SyntaxError: invalid syntax" in err
    assert "keep running: `scancel` them" in err
