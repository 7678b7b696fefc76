"""The doctor's probe job: a short Slurm batch job on each idle node that reads and
asks, as a project's job would, and prints one ``gpulab-doctor`` line per fact; the
hub side judges them.

On the node it reads gres.conf as slurmd does (``slurmd -G``), looks at each device
file gpulab lists for the node (a character device; its minor number) and at the
NVIDIA driver's per-GPU files (``node_nvidia_proc``, where the batch script finds
each minor's GPU), asks the node's Docker engine for its version (DOCKER_HOST made
from ``node_docker_host`` exactly as the batch script makes it), hashes the
cluster's Epilog and looks for gpulab's container labels in it, and pulls the
doctor's tiny probe image by digest from ``registry_for_nodes`` with
``node_docker_config`` (then removes it again), and reads the file the hub wrote
just now in each folder project containers mount (the projects' and the data's
storage must be the same on every node). Every step has a time limit; the job
has ``--time=1``, 64 MB, one CPU and ``--export=NONE`` (the hub's environment stays
on the hub). The doctor waits a bounded time: a job still pending then is cancelled
and its node reported busy, never waited for.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpulab_hub.cluster import ClusterError, batch, slurm_name
from gpulab_hub.cluster.joblog import JobLog
from gpulab_hub.cluster.slurm import SQUEUE_FORMAT, Job, Node, Slurm, parse_squeue
from gpulab_hub.cluster.traits import ClusterTraits
from gpulab_hub.doctor.findings import FAIL, OK, WARN, Finding

SAY = "gpulab-doctor"
_PATH = re.compile(r"/[A-Za-z0-9._/-]{1,255}")
_UUID = re.compile(r"GPU-[0-9A-Za-z-]{1,80}")
_SHA = re.compile(r"[0-9a-f]{64}")
_VERSION = re.compile(r"[0-9A-Za-z.+~-]{1,40}")
_SECONDS = re.compile(r"[0-9]{1,4}(\.[0-9]{1,3})?")
_MARKER = re.compile(r"\.gpulab-doctor-[0-9a-f]{16}")
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE")  # fmt: skip


@dataclass(frozen=True)
class Waits:
    """How long the doctor waits for its probe jobs (seconds from submission)."""

    pending: float = 10.0  # still pending then: the node is busy, the job is cancelled
    total: float = 75.0  # not finished then: cancelled, reported with what it said


@dataclass(frozen=True)
class ProbeJob:
    prefix: str
    epilog: str = ""  # the cluster's Epilog path ("" when none, or not one file)
    expected_epilog: str = ""  # what gpulab renders for these settings
    image: str = ""  # the probe image by digest as nodes pull it ("" when not pushed)
    # (folder, marker file name, marker's words): a file the hub wrote just now in each
    # folder containers mount (projects, data); each node must read the same words there
    storage: tuple[tuple[str, str, str], ...] = ()


@dataclass
class Result:
    """What one node's probe said."""

    node: str
    job_id: int = 0
    state: str = ""  # Slurm's last word on the job
    reason: str = ""
    said: list[list[str]] = field(default_factory=list)  # each line's words, SAY removed
    ended: bool = False  # the script reached its end
    busy: bool = False  # still pending when the doctor stopped waiting
    error: str = ""  # why there is no answer (sbatch refused, the job failed, a timeout)
    last_lines: list[str] = field(default_factory=list)  # other lines, for failures
    seconds: float = 0.0

    def lines(self, kind: str) -> list[list[str]]:
        return [words[1:] for words in self.said if words and words[0] == kind]


def _q(value: str) -> str:
    return shlex.quote(value)


def _path(value: str, what: str) -> str:
    if not isinstance(value, str) or _PATH.fullmatch(value) is None or ".." in value:
        raise ClusterError(f"{what} {value!r} is not a path the doctor's probe uses")
    return value


def render(cfg: ClusterTraits, job: ProbeJob, files: list[str]) -> str:
    """The probe's batch script for a node with these GPU device files."""
    devices = " ".join(_q(_path(f, "GPU device file")) for f in files)
    proc = _q(_path(cfg.node_nvidia_proc, "node_nvidia_proc"))
    engine = batch.NodeEngine(host=cfg.node_docker_host)
    config = ""
    if cfg.node_docker_config:
        config = f" --config {_q(_path(cfg.node_docker_config, 'node_docker_config'))}"
    labels = (f"label={batch.CLUSTER_LABEL}={slurm_name(cfg.cluster_name, 'Cluster')}",
              f"label={batch.JOB_LABEL}=")  # fmt: skip
    epilog = _q(_path(job.epilog, "Epilog")) if job.epilog else "''"
    return (
        "#!/bin/bash\n"
        "# gpulab doctor's probe of a node (docs/cluster.md): it reads and asks; it changes\n"
        "# nothing but the probe image it pulls and removes again.\n"
        "set -u\n"
        f"export PATH={batch.SCRIPT_PATH}\n"
        "docker=docker\n"
        f"say() {{ printf '{SAY} %s\\n' \"$*\"; }}\n"
        "last() { printf '%s\\n' \"$1\" | tail -n 1 | tr -d '\\r' | cut -c1-250; }\n"
        + batch._node_block(engine, "say node-unknown; say end; exit 0")
        + 'say node "$node"\n'
        # gres.conf as slurmd reads it, one GRES per line
        'if gres=$(timeout 10 slurmd -G -N "$node" 2>&1); then\n'
        "  printf '%s\\n' \"$gres\" | sed -n 's/^.*Gres \\(Name=gpu .*\\)$/\\1/p' | head -n 64 |\n"
        '    while IFS= read -r line; do say gres "$line"; done\n'
        "else\n"
        '  say gres-error "$(last "$gres")"\n'
        "fi\n"
        f"for dev in {devices}; do\n"
        '  if [ ! -e "$dev" ]; then say device missing "$dev"\n'
        '  elif [ ! -c "$dev" ]; then say device not-char "$dev"\n'
        '  else say device char "$dev" "$((16#$(stat -L -c %T -- "$dev")))"; fi\n'
        "done\n"
        f"for f in {proc}/*/information; do\n"
        '  [ -r "$f" ] || continue\n'
        "  minor=$(sed -n 's/^Device Minor:[[:space:]]*\\([0-9]*\\)[[:space:]]*$/\\1/p' \"$f\""
        " | head -n 1)\n"
        "  uuid=$(sed -n 's/^GPU UUID:[[:space:]]*\\([^[:space:]]*\\).*$/\\1/p' \"$f\""
        " | head -n 1)\n"
        '  say gpu "${minor:-?}" "${uuid:-?}"\n'
        "done\n"
        "if v=$(timeout 15 \"$docker\" version --format '{{.Server.Version}}' 2>&1); then\n"
        '  say engine ok "$(last "$v")"; engine=1\n'
        "else\n"
        '  say engine fail "$(last "$v")"; engine=0\n'
        "fi\n"
        f"epilog={epilog}\n"
        'if [ -z "$epilog" ]; then :\n'
        'elif [ ! -e "$epilog" ]; then say epilog missing\n'
        'elif [ ! -r "$epilog" ]; then say epilog unreadable\n'
        "else\n"
        '  say epilog sha256 "$(head -c 1048576 -- "$epilog" | sha256sum | cut -c1-64)"\n'
        '  [ -x "$epilog" ] || say epilog not-executable\n'
        f'  grep -qF -- {_q(labels[0])} "$epilog" && say epilog cluster-label\n'
        f'  grep -qF -- {_q(labels[1])} "$epilog" && say epilog job-label\n'
        "fi\n"
        + (
            f"image={_q(job.image)}\n"
            'if [ "$engine" = 1 ]; then\n'
            "  t0=$(date +%s.%N)\n"
            f'  if out=$(timeout 40 "$docker"{config} pull -q "$image" 2>&1); then\n'
            "    t1=$(date +%s.%N)\n"
            '    say pull ok "$(awk -v a="$t0" -v b="$t1"'
            ' \'BEGIN { printf "%.2f", b - a }\')"\n'
            '    timeout 15 "$docker" rmi "$image" >/dev/null 2>&1 || true\n'
            "  else\n"
            '    say pull fail "$(last "$out")"\n'
            "  fi\n"
            "fi\n"
            if job.image
            else ""
        )
        + _storage_block(job)
        + "say end\n"
    )


def _storage_block(job: ProbeJob) -> str:
    out = ""
    for folder, marker, _ in job.storage:
        where = _q(_path(folder, "storage folder"))
        if _MARKER.fullmatch(marker) is None:
            raise ClusterError(f"marker {marker!r} is not one the doctor writes")
        path = _q(f"{folder}/{marker}")
        out += (
            f"if [ -f {path} ] && [ ! -L {path} ]; then\n"
            f'  say storage {where} "$(head -c 64 -- {path} | tr -cd \'0-9a-f\')"\n'
            f"elif [ -d {where} ]; then say storage {where} other-folder\n"
            f"else say storage {where} missing; fi\n"
        )
    return out


def _read(log: JobLog) -> list[str]:
    """The whole lines written since the last read."""
    lines: list[str] = []
    while True:
        before = log.offset
        lines += [s.text for s in log.read()]
        if log.offset == before:
            return lines


def _take(result: Result, lines: list[str]) -> None:
    for line in lines:
        words = line.split(" ")
        if words[0] == SAY and len(words) > 1:
            result.said.append(words[1:])
            if words[1:] == ["end"]:
                result.ended = True
        elif line.strip():
            result.last_lines = [*result.last_lines[-4:], line.strip()]


def _queue(client: Slurm, ids: list[int]) -> dict[int, Job]:
    done = client.call(
        "squeue", "--noheader", "--states=all", f"--format={SQUEUE_FORMAT}",
        "--jobs=" + ",".join(str(i) for i in ids),
    )  # fmt: skip
    if done.returncode != 0:
        if "Invalid job id" in done.stderr:
            return {}
        raise ClusterError(f"Slurm's squeue failed: {done.stderr.strip()[:300]}")
    return {j.id: j for j in parse_squeue(done.stdout)}


def _cancel(client: Slurm, job_id: int) -> None:
    with contextlib.suppress(ClusterError):
        client.cancel(job_id)


def run(client: Slurm, cfg: ClusterTraits, job: ProbeJob, nodes: list[Node], waits: Waits):
    """Blocking: one probe job per node, all at once; each node's Result (bounded by
    ``waits``; jobs still pending or running then are cancelled)."""
    results = {n.name: Result(n.name) for n in nodes}
    if not nodes:
        return results
    folder = Path(cfg.job_log_dir) if cfg.job_log_dir else None
    if folder is None:
        for r in results.values():
            r.error = "no job_log_dir is set, so the probe's output has nowhere to go"
        return results
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    logs: dict[int, tuple[Result, JobLog, Path]] = {}
    started = time.monotonic()
    for n in nodes:
        r = results[n.name]
        files = list(dict(cfg.node_gpus).get(n.name, []))
        try:
            script = render(cfg, job, [f for f in files if _PATH.fullmatch(f)])
            request = batch.JobRequest(
                name=f"{job.prefix}-doctor", mem_mb=64, cpus=1, partition=cfg.partition,
                time_limit="1", output=str(folder / f"doctor-{n.name}-%j.log"),
            )  # fmt: skip
            args = [*batch.sbatch_args(request), f"--nodelist={slurm_name(n.name, 'Node')}"]
            r.job_id = client.submit(script, args)
        except ClusterError as e:
            r.error = str(e)
            continue
        path = folder / f"doctor-{n.name}-{r.job_id}.log"
        logs[r.job_id] = (r, JobLog(path), path)
    waiting = dict(logs)
    try:
        while waiting:
            queue = _queue(client, list(waiting))
            now = time.monotonic() - started
            for job_id, (r, log, _) in list(waiting.items()):
                _take(r, _read(log))
                info = queue.get(job_id)
                if info is not None:
                    r.state, r.reason = info.state, info.reason
                if r.ended or info is None or info.state in ENDED:
                    _take(r, [s.text for s in log.read_all()])
                    r.seconds = now
                    if not r.ended:
                        r.error = f"the probe job ended ({r.state or 'gone'}) without finishing"
                    del waiting[job_id]
                elif info.state == "PENDING" and now > waits.pending:
                    _cancel(client, job_id)
                    r.busy = True
                    del waiting[job_id]
                elif now > waits.total:
                    _cancel(client, job_id)
                    r.error = f"the probe did not finish within {waits.total:g} s"
                    del waiting[job_id]
            if waiting:
                time.sleep(0.3)
    finally:
        for job_id in waiting:
            _cancel(client, job_id)
        for _, _, path in logs.values():
            with contextlib.suppress(OSError):
                path.unlink()
    return results


# --- judging what the probes said ------------------------------------------------------


def _gres_files(r: Result) -> list[str] | None:
    """The GPU files of the node's gres.conf in order (None when slurmd -G said none)."""
    found = []
    for words in r.lines("gres"):
        fields = dict(w.split("=", 1) for w in words if "=" in w)
        if fields.get("Name") == "gpu" and fields.get("File", "(null)") != "(null)":
            found.append(fields["File"])
    return found if found or not r.lines("gres-error") else None


def device_problems(cfg: ClusterTraits, r: Result) -> tuple[list[str], str]:
    """(what is wrong with the node's device files, what is right) from its probe."""
    files = list(dict(cfg.node_gpus).get(r.node, []))
    gpus = {w[0]: w[1] for w in r.lines("gpu") if len(w) == 2 and _UUID.fullmatch(w[1])}
    problems, good = [], []
    for words in r.lines("device"):
        kind, path = words[0], words[1] if len(words) > 1 else "?"
        if kind == "missing":
            problems.append(f"{path} does not exist")
        elif kind == "not-char":
            problems.append(f"{path} is not a character device")
        elif kind == "char" and len(words) == 3:
            minor = words[2]
            if minor not in gpus:
                problems.append(
                    f"{path} (minor {minor}) has no NVIDIA GPU in {cfg.node_nvidia_proc}"
                )
            else:
                good.append(f"{path} (minor {minor}, {gpus[minor]})")
    for f in files:
        if _PATH.fullmatch(f) is None or ".." in f:
            problems.append(f"{f!r} is not a device path gpulab uses")
    order = _gres_files(r)
    if order is not None and files and order != files:
        problems.append(
            f"gres.conf lists {', '.join(order) or 'no GPU file'} (slurmd -G), gpulab lists "
            f"{', '.join(files)}: Slurm's GPU index would reach the container as another "
            "device"
        )
    note = "" if order is not None else " (gres.conf not read: slurmd -G failed)"
    return problems, ", ".join(good) + note


def findings(cfg: ClusterTraits, job: ProbeJob, results: dict, busy: list[Node]) -> list:
    """Findings from every node's probe: cluster.probe, then devices, engine, Epilog and
    the registry from the nodes (one ok finding each, one per node with a problem)."""
    out: list[Finding] = []
    done = [r for r in results.values() if r.ended]
    skipped = [f"{n.name} ({n.state}{n.flag})" for n in busy]
    skipped += [f"{r.node} (its job waited: {r.reason or 'busy'})" for r in results.values()
                if r.busy]  # fmt: skip
    words = f"probe jobs finished on {len(done)} of {len(results) + len(busy)} node(s) taking jobs"
    if done:
        words += ": " + ", ".join(f"{r.node} (job {r.job_id}, {r.seconds:.1f} s)" for r in done)
    if skipped:
        words += "; busy, not probed: " + ", ".join(skipped)
    out.append(Finding("cluster.probe", OK, words))
    for r in results.values():
        if r.error:
            out.append(_probe_failed(cfg, r))
    out += _devices(cfg, done)
    out += _engines(cfg, done)
    if job.epilog:
        out += _epilogs(job, done)
    if job.image:
        out += _pulls(cfg, done)
    if job.storage:
        out += _storage(job, done)
    return out


def _storage(job: ProbeJob, done: list[Result]) -> list[Finding]:
    out, good = [], []
    for r in done:
        seen = {w[0]: w[1] for w in r.lines("storage") if len(w) == 2}
        wrong = []
        for folder, _, words in job.storage:
            got = seen.get(folder, "")
            if got == words:
                continue
            if got == "missing":
                wrong.append(f"{folder} does not exist there")
            else:
                wrong.append(f"{folder} there is another folder (a file the hub wrote in it "
                             "just now is not in it)")  # fmt: skip
        if wrong:
            out.append(
                Finding(
                    f"cluster.storage.{r.node}",
                    FAIL,
                    f"node {r.node} does not see the hub's folders: {'; '.join(wrong)}. "
                    "Projects started there would fail, or work in folders that are not the "
                    "users' files",
                    "Mount the storage that holds gpulab's projects and data on every node "
                    "at the same path as on the hub (docs/cluster.md, Setting it up).",
                )
            )
        else:
            good.append(r.node)
    if good:
        folders = ", ".join(f for f, _, _ in job.storage)
        out.insert(
            0,
            Finding(
                "cluster.storage",
                OK,
                f"the hub's folders {folders} are the same storage on {', '.join(good)}",
            ),
        )
    return out


def _probe_failed(cfg: ClusterTraits, r: Result) -> Finding:
    said = f"; its last lines: {' | '.join(r.last_lines)}" if r.last_lines else ""
    if r.job_id and not r.said:
        return Finding(
            f"cluster.probe.{r.node}",
            FAIL,
            f"node {r.node}: {r.error} and wrote nothing to {cfg.job_log_dir}{said}",
            "job_log_dir must be on storage every node mounts at the same path, writable by "
            "the user jobs run as (project jobs report there too); see the job with "
            f"`scontrol show job {r.job_id}` and slurmd's log on {r.node}.",
        )
    return Finding(
        f"cluster.probe.{r.node}",
        WARN,
        f"node {r.node} was not probed: {r.error}{said}",
        "Run the doctor again; if it persists, look at the job "
        f"(`sacct -j {r.job_id}`) and slurmd's log on {r.node}.",
    )


def _devices(cfg: ClusterTraits, done: list[Result]) -> list[Finding]:
    out, good = [], []
    for r in done:
        problems, right = device_problems(cfg, r)
        if problems:
            out.append(
                Finding(
                    f"cluster.devices.{r.node}",
                    FAIL,
                    f"node {r.node}'s GPU device files: {'; '.join(problems)}",
                    f'Make c.ProjectSlurmSpawner.node_gpus["{r.node}"] the node\'s GPU '
                    "device files exactly as its gres.conf lists them, in that order "
                    "(`slurmd -G` on the node prints them), and check the NVIDIA driver there.",
                )
            )
        elif right:
            good.append(f"{r.node}: {right}")
    if good:
        out.insert(
            0,
            Finding(
                "cluster.devices",
                OK,
                "device files are NVIDIA GPUs in gres.conf's order on " + "; ".join(good),
            ),
        )
    return out


def _engines(cfg: ClusterTraits, done: list[Result]) -> list[Finding]:
    where = cfg.node_docker_host or "the node's default Docker socket"
    out, good = [], []
    for r in done:
        said = r.lines("engine")
        if said and said[0][0] == "ok" and _VERSION.fullmatch(" ".join(said[0][1:])):
            good.append(f"{r.node} (Docker {' '.join(said[0][1:])})")
            continue
        msg = " ".join(said[0][1:]) if said else "no answer"
        out.append(
            Finding(
                f"cluster.engine.{r.node}",
                FAIL,
                f"node {r.node}'s Docker engine ({where}) does not answer: {msg}",
                f"Start Docker on {r.node} (`systemctl start docker`), check that the user "
                "jobs run as may use it, or set c.ProjectSlurmSpawner.node_docker_host to "
                'where it listens ("" for the default socket).',
            )
        )
    if good:
        out.insert(
            0,
            Finding(
                "cluster.engine", OK, f"the Docker engine ({where}) answers on " + ", ".join(good)
            ),
        )
    return out


def _epilogs(job: ProbeJob, done: list[Result]) -> list[Finding]:
    want = hashlib.sha256(job.expected_epilog.encode()).hexdigest()
    fix = (
        f"Save `gpulab doctor --print-epilog` as {job.epilog} (executable) on every node; "
        "it removes the containers of a job that was killed outright."
    )
    out, good = [], []
    for r in done:
        said = {w[0] for w in r.lines("epilog") if w}
        sha = next((w[1] for w in r.lines("epilog") if len(w) == 2 and w[0] == "sha256"), "")
        fid = f"cluster.epilog.{r.node}"
        where = f"node {r.node}'s Epilog {job.epilog}"
        if "missing" in said or "unreadable" in said:
            what = "does not exist" if "missing" in said else "cannot be read"
            out.append(
                Finding(fid, FAIL, f"{where} {what}: Slurm drains a node whose Epilog fails", fix)
            )
        elif "not-executable" in said:
            out.append(Finding(fid, FAIL, f"{where} is not executable: Slurm cannot run it", fix))
        elif _SHA.fullmatch(sha) and sha == want:
            good.append(r.node)
        elif {"cluster-label", "job-label"} <= said:
            out.append(
                Finding(
                    fid,
                    WARN,
                    f"{where} removes gpulab's containers, but it is not the Epilog gpulab "
                    "renders for these settings (cluster_name, node_docker_host): an older "
                    "copy, or one changed by hand",
                    fix,
                )
            )
        else:
            out.append(
                Finding(
                    fid,
                    FAIL,
                    f"{where} does not remove gpulab's containers (no gpulab.slurm labels in "
                    "it): a project whose job is killed outright keeps running",
                    fix,
                )
            )
    if good:
        out.insert(
            0,
            Finding(
                "cluster.epilog",
                OK,
                f"the cluster's Epilog {job.epilog} is gpulab's (it removes the containers of "
                f"a job killed outright) on {', '.join(good)}",
            ),
        )
    return out


def _pulls(cfg: ClusterTraits, done: list[Result]) -> list[Finding]:
    where = cfg.registry_for_nodes or cfg.registry
    auth = (
        f"with the credentials in {cfg.node_docker_config}"
        if cfg.node_docker_config
        else "without credentials (node_docker_config is not set)"
    )
    out, good, untried = [], [], []
    for r in done:
        said = r.lines("pull")
        if not said:
            untried.append(r.node)
            continue
        if said[0][0] == "ok" and len(said[0]) == 2 and _SECONDS.fullmatch(said[0][1]):
            good.append(f"{r.node} in {said[0][1]} s")
            continue
        out.append(
            Finding(
                f"cluster.pull.{r.node}",
                FAIL,
                f"node {r.node} cannot fetch images from the registry {where} ({auth}): "
                f"{' '.join(said[0][1:]) or 'no message'}",
                "Check c.ProjectSlurmSpawner.registry_for_nodes (the registry's host:port as "
                "the nodes reach it), that the node's engine trusts it (insecure-registries "
                "for a registry without TLS), and the credentials in node_docker_config.",
            )
        )
    if good:
        seen = f"nodes fetch images from the registry {where} ({auth}): " + ", ".join(good)
        if untried:
            seen += f"; not tried on {', '.join(untried)} (its Docker engine does not answer)"
        out.insert(0, Finding("cluster.pull", OK, seen))
    return out
