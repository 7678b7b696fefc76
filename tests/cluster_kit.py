"""A real Slurm cluster on this machine, for tests: munged, slurmctld and two slurmd
nodes, each node in network and UTS namespaces the kit makes, with dummy GPU device
nodes listed as GRES ``gpu``.

Everything is named with the test prefix and lives under ``<tmp>/<prefix>-slurm/``:
the munge key and socket, slurm.conf/gres.conf/cgroup.conf (SLURM_CONF points
there), the controller's state, each node's spool, the logs, the namespaces (files
bind-mounted by ``unshare``), the device nodes and the fake NVIDIA /proc files.

Network: the nodes' veths and one veth from this host meet on a bridge inside a
"fabric" namespace of the kit's own (so this host's firewall, whose FORWARD policy
may drop bridged traffic, is never involved and never touched). This host gets one
interface with one address on a private /24 (its link route and nothing else);
slurmctld runs here and listens on it, each slurmd runs in its node's namespaces
(``nsenter --net --uts``, never ``ip netns exec``, which remounts /sys and breaks
slurmd's cgroup code) with the node name as its host name.

Process tracking is ``proctrack/linuxproc`` and ``task/none``: two slurmd on one
kernel would share cgroup paths. GRES index and device minor differ on purpose
(node 2 lists nvidia3 before nvidia2): Slurm's index is the position in the list.
The fake ``information`` files carry minors that are distinct across the nodes (they
share one /proc here), so a batch script reading them finds one GPU per minor.

``SlurmKit.start`` removes what an earlier crashed run of the same prefix left
(daemons whose command line names the kit's folder, processes in its namespaces,
the namespaces, the interface, the folder), starts everything and waits until sinfo
shows every node idle; ``stop`` ends every process it started (by the PID and start
time it recorded) and every process left in its node namespaces, then removes the
namespaces, the interface and the folder.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from gpulab_hub import host, pidfile
from gpulab_hub.cluster.batch import NodeGpus
from gpulab_hub.cluster.slurm import DEFAULT_PATH, Slurm

GPU_MAJOR = 195  # the NVIDIA driver's character-device major; no driver here: ENXIO
GPU_TYPE = "h200"
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo", "nsenter", "unshare", "ip")


class KitError(Exception):
    pass


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise KitError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"----- {path.name}: (none)"
    return f"----- {path.name} (last {lines} lines)\n" + "\n".join(text.splitlines()[-lines:])


@dataclass
class KitNode:
    name: str
    address: str
    minors: tuple[int, ...]
    files: tuple[str, ...] = ()
    uuids: dict[int, str] = field(default_factory=dict)  # minor -> fake UUID


class SlurmKit:
    """One test cluster. Use as a context manager (start, yield, stop)."""

    def __init__(
        self,
        prefix: str,
        gpu_minors: tuple[tuple[int, ...], ...] = ((0,), (3, 2)),
        epilog: str | None = None,
        cpus: int = 2,
        mem_mb: int = 1024,
        def_mem_per_cpu_mb: int = 256,
        root: Path | None = None,
        idle_timeout: float = 30,
    ):
        if not re.fullmatch(r"gpulab[a-z0-9]{0,20}", prefix):
            raise KitError(f"test prefix {prefix!r}: 'gpulab' and up to 20 letters or digits")
        every = [m for minors in gpu_minors for m in minors]
        if len(every) != len(set(every)):
            raise KitError("GPU minors must be distinct across nodes (one fake /proc here)")
        self.prefix = prefix
        self.cluster = prefix
        self.root = root or Path(tempfile.gettempdir()) / f"{prefix}-slurm"
        digest = hashlib.sha1(prefix.encode()).hexdigest()
        self.host_if = f"sk{digest[:8]}"  # 10 characters (Linux allows 15)
        self.net = self._pick_subnet(int(digest[8:14], 16))
        hosts = list(self.net.hosts())
        self.controller_address = str(hosts[0])
        self.nodes = [
            KitNode(f"{prefix}-n{i + 1}", str(hosts[10 + i]), tuple(minors))
            for i, minors in enumerate(gpu_minors)
        ]
        self.epilog = epilog
        self.cpus, self.mem_mb, self.def_mem = cpus, mem_mb, def_mem_per_cpu_mb
        self.idle_timeout = idle_timeout
        self.ctld_port = self.slurmd_port = 0
        self._procs: dict[str, subprocess.Popen] = {}

    # --- paths -----------------------------------------------------------------------

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    @property
    def nvidia_proc(self) -> Path:
        return self.root / "nvidia-proc"

    @property
    def epilog_path(self) -> Path:
        return self.root / "epilog.sh"

    def ns(self, name: str, kind: str) -> Path:
        return self.root / "ns" / f"{name}-{kind}"

    def slurm(self) -> Slurm:
        """gpulab's Slurm client for this cluster."""
        return Slurm(conf=str(self.conf), path=DEFAULT_PATH)

    def env(self) -> dict[str, str]:
        """Environment for Slurm's commands run by a test."""
        return {"PATH": DEFAULT_PATH, "SLURM_CONF": str(self.conf), "LC_ALL": "C.UTF-8"}

    def gres(self) -> tuple[NodeGpus, ...]:
        """Each node's GPU device files in GRES order (what batch.SlurmGpus needs)."""
        return tuple(NodeGpus(n.name, n.files) for n in self.nodes)

    # --- start and stop --------------------------------------------------------------

    def __enter__(self) -> SlurmKit:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        missing = [c for c in PROGRAMS if shutil.which(c, path=DEFAULT_PATH) is None]
        if missing:
            raise KitError(
                f"{', '.join(missing)} not installed: `scripts/setup.sh test` installs "
                "Debian's slurm-wlm and munge"
            )
        self.clean_leftovers()
        for sub in ("etc", "state", "log", "ns", "pids", "dev", "out"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        try:
            self._make_devices()
            self._write_config()
            self._start_munge()
            self._make_network()
            self._start("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
            for n in self.nodes:
                self._start(
                    n.name,
                    [
                        "nsenter",
                        f"--net={self.ns(n.name, 'net')}",
                        f"--uts={self.ns(n.name, 'uts')}",
                        "slurmd", "-D", "-f", str(self.conf),
                    ],
                )  # fmt: skip
            self.wait_idle()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Everything the kit started ends; its namespaces, interface and folder go."""
        for n in self.nodes:
            self._stop_started(n.name)
        self._kill_in_namespaces()
        for name in ("slurmctld", "munged"):
            self._stop_started(name)
        self.clean_leftovers()

    def _stop_started(self, name: str) -> None:
        proc = self._procs.pop(name, None)
        if proc is None:
            return
        me = pidfile.read(self.root / "pids" / f"{name}.pid")
        if isinstance(me, pidfile.Identity) and me.pid == proc.pid:
            host.stop_pid(proc.pid, timeout=10, expect=me)
        proc.wait(timeout=15)

    # --- leftovers -------------------------------------------------------------------

    def _ours(self) -> list[int]:
        """PIDs whose command line names the kit's folder or that run in its namespaces."""
        wanted = str(self.root).encode()
        namespaces = set()
        for f in (self.root / "ns").glob("*-net") if (self.root / "ns").is_dir() else ():
            st = os.stat(f)
            if st.st_size == 0 and _is_nsfs(f):
                namespaces.add((st.st_dev, st.st_ino))
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if wanted in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
                    continue
                st = os.stat(entry / "ns" / "net")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in namespaces:
                found.append(int(entry.name))
        return found

    def _kill_in_namespaces(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = [p for p in self._ours() if pidfile.identity(p) is not None]
            if not pids:
                return
            for pid in pids:
                ident = pidfile.identity(pid)
                if ident is not None:
                    _kill(pid, sig)
            # TERM lets a job's script run its trap; slurmstepd waits for KILL.
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline and any(
                pidfile.identity(p) is not None for p in pids
            ):
                time.sleep(0.1)

    def clean_leftovers(self) -> None:
        """Remove what a run of this prefix left: processes, namespaces, interface, folder."""
        if self.root.exists():
            self._kill_in_namespaces()
            for f in sorted((self.root / "ns").glob("*")) if (self.root / "ns").is_dir() else ():
                if _is_nsfs(f):
                    _run("umount", str(f), check=False)
        # The interface goes with the fabric namespace (its veth peer), a moment later.
        _run("ip", "link", "del", self.host_if, check=False)
        deadline = time.monotonic() + 5
        while _run("ip", "link", "show", self.host_if, check=False).returncode == 0:
            if time.monotonic() > deadline:
                raise KitError(f"interface {self.host_if} is still there")
            time.sleep(0.05)
        shutil.rmtree(self.root, ignore_errors=True)

    # --- pieces ----------------------------------------------------------------------

    @staticmethod
    def _pick_subnet(seed: int) -> ipaddress.IPv4Network:
        used = []
        for line in _run("ip", "-o", "-4", "route", "show", "table", "all").stdout.splitlines():
            dest = line.split()[0]
            if dest[0].isdigit():
                used.append(ipaddress.ip_network(dest, strict=False))
        for i in range(256):
            s = (seed + i * 7919) % 65536
            net = ipaddress.ip_network(f"10.{200 + s % 50}.{s // 50 % 256}.0/24")
            if not any(net.overlaps(u) for u in used):
                return net
        raise KitError("no free private /24 for the test cluster")

    def _make_devices(self) -> None:
        for n in self.nodes:
            folder = self.root / "dev" / n.name
            folder.mkdir(parents=True)
            files = []
            for minor in n.minors:
                path = folder / f"nvidia{minor}"
                os.mknod(path, 0o600 | 0o020000, os.makedev(GPU_MAJOR, minor))
                files.append(str(path))
                n.uuids[minor] = "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{n.name}.{minor}"))
                info = self.nvidia_proc / f"{n.name}-{minor}" / "information"
                info.parent.mkdir(parents=True)
                info.write_text(
                    f"Model: \t\t NVIDIA H200 (test kit)\nGPU UUID: \t {n.uuids[minor]}\n"
                    f"Device Minor: \t {minor}\n"
                )
            n.files = tuple(files)

    def _write_config(self) -> None:
        self.ctld_port, self.slurmd_port = _free_port(), _free_port()
        r = self.root
        lines = [
            f"ClusterName={self.cluster}",
            f"SlurmctldHost={socket.gethostname().split('.')[0]}({self.controller_address})",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool/%n",
            f"SlurmctldPidFile={r}/state/slurmctld.pid",
            f"SlurmdPidFile={r}/spool/slurmd-%n.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "GresTypes=gpu",
            f"DefMemPerCPU={self.def_mem}",
            "ReturnToService=2",
            "KillWait=5",
            "MinJobAge=300",
            "InactiveLimit=0",
        ]
        if self.epilog is not None:
            self.epilog_path.write_text(self.epilog)
            self.epilog_path.chmod(0o755)
            lines.append(f"Epilog={self.epilog_path}")
        gres = []
        for n in self.nodes:
            (r / "spool" / n.name).mkdir(parents=True)
            lines.append(
                f"NodeName={n.name} NodeHostname={n.name} NodeAddr={n.address} "
                f"CPUs={self.cpus} RealMemory={self.mem_mb} "
                f"Gres=gpu:{GPU_TYPE}:{len(n.files)} State=UNKNOWN"
            )
            gres += [f"NodeName={n.name} Name=gpu Type={GPU_TYPE} File={f}" for f in n.files]
        names = ",".join(n.name for n in self.nodes)
        lines.append(f"PartitionName=gpu Nodes={names} Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        (r / "etc" / "gres.conf").write_text("\n".join(gres) + "\n")
        # Read by slurmd; the plugins above use no cgroup.
        (r / "etc" / "cgroup.conf").write_text("CgroupPlugin=autodetect\nConstrainDevices=no\n")

    def _start(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")  # noqa: SIM115 (the child keeps it)
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env(),
                start_new_session=True,
            )
        finally:
            log.close()
        self._procs[name] = proc
        if not pidfile.write(self.root / "pids" / f"{name}.pid", proc.pid):
            raise KitError(f"{name} exited at once:\n{self.logs()}")

    def _start_munge(self) -> None:
        d = self.root / "munge"
        d.mkdir(mode=0o755)
        key = d / "munge.key"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, os.urandom(1024))
        finally:
            os.close(fd)
        self._start(
            "munged",
            [
                "munged", "-F", f"--socket={self.munge_socket}", f"--key-file={key}",
                f"--pid-file={d}/munged.pid", f"--seed-file={d}/munged.seed",
                f"--log-file={self.root}/log/munged.log",
            ],
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while not self.munge_socket.exists():
            if time.monotonic() > deadline or self._procs["munged"].poll() is not None:
                raise KitError(f"munged did not start:\n{self.logs()}")
            time.sleep(0.05)

    def _make_network(self) -> None:
        fabric = self.ns("fabric", "net")
        fabric.touch()
        _run("unshare", f"--net={fabric}", "true")
        _run("nsenter", f"--net={fabric}", "ip", "link", "add", "br0", "type", "bridge")
        _run("nsenter", f"--net={fabric}", "ip", "link", "set", "br0", "up")
        _run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", "host",
             "netns", str(fabric))  # fmt: skip
        _run("nsenter", f"--net={fabric}", "ip", "link", "set", "host", "master", "br0", "up")
        _run("ip", "addr", "add", f"{self.controller_address}/24", "dev", self.host_if)
        _run("ip", "link", "set", self.host_if, "up")
        for i, n in enumerate(self.nodes):
            net, uts = self.ns(n.name, "net"), self.ns(n.name, "uts")
            net.touch()
            uts.touch()
            _run("unshare", f"--net={net}", f"--uts={uts}", "hostname", n.name)
            port = f"n{i + 1}"
            _run("ip", "link", "add", port, "netns", str(fabric), "type", "veth",
                 "peer", "name", "eth0", "netns", str(net))  # fmt: skip
            _run("nsenter", f"--net={fabric}", "ip", "link", "set", port, "master", "br0", "up")
            inside = ["nsenter", f"--net={net}", "ip"]
            _run(*inside, "link", "set", "lo", "up")
            _run(*inside, "addr", "add", f"{n.address}/24", "dev", "eth0")
            _run(*inside, "link", "set", "eth0", "up")

    def wait_idle(self) -> None:
        """Until sinfo shows every node idle (bounded), else KitError with the logs."""
        client = self.slurm()
        deadline = time.monotonic() + self.idle_timeout
        seen = "nothing"
        while time.monotonic() < deadline:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise KitError(f"{name} exited ({proc.returncode}):\n{self.logs()}")
            done = client.call("sinfo", "--noheader", "-N", "--format=%N|%T|%G|%E")
            seen = (done.stdout + done.stderr).strip()
            if done.returncode == 0:
                nodes = {n.name: n for n in client.nodes()}
                if all(
                    n.name in nodes and nodes[n.name].state == "idle" and not nodes[n.name].flag
                    for n in self.nodes
                ):
                    return
            time.sleep(0.2)
        raise KitError(
            f"the test cluster's nodes were not idle after {self.idle_timeout:g} s; "
            f"sinfo says:\n{seen}\n{self.logs()}"
        )

    def logs(self) -> str:
        """The tails of every daemon's log, for failure messages."""
        files = sorted((self.root / "log").glob("*")) if (self.root / "log").is_dir() else []
        return "\n".join(_tail(f) for f in files) or "(no logs)"


def _is_nsfs(path: Path) -> bool:
    """True if ``path`` is a namespace bind-mounted by unshare (a mount point)."""
    try:
        with open("/proc/self/mountinfo") as f:
            return any(line.split()[4] == str(path) for line in f)
    except OSError:
        return False


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def daemons_left(kit: SlurmKit) -> list[str]:
    """Live (non-zombie) processes whose command line names the kit's folder, as
    ``pgrep -a -f`` prints them."""
    done = subprocess.run(["pgrep", "-a", "-f", str(kit.root)], capture_output=True, text=True)
    return [
        line
        for line in done.stdout.splitlines()
        if pidfile.identity(int(line.split()[0])) is not None
    ]


def tiny_image_tar(path: Path) -> Path:
    """A root file system holding only /bin/sleep and the libraries it links (a few
    MB): enough for a container that runs until it is stopped."""
    sleep = shutil.which("sleep")
    libs = re.findall(r"(/\S+\.so[.\d]*)", _run("ldd", sleep).stdout)
    with tarfile.open(path, "w") as tar:
        for f in [sleep, *libs]:
            real = os.path.realpath(f)
            tar.add(real, arcname=f.lstrip("/"))
            if real != f:
                tar.add(real, arcname=real.lstrip("/"))
    return path
