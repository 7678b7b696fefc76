"""What projects and builds may reach beyond the box: gpulab's rules on the host's
FORWARD path, for IPv4 (iptables) and IPv6 (ip6tables).

firewall.py keeps containers off the host's own services (INPUT); what they send
*through* the host (NATed out of its interfaces) passes FORWARD, where Docker leaves
``DOCKER-USER`` to the admin. Without rules there, a project or a build step reaches
the cloud's metadata service (169.254.169.254, fd00:ec2::254: on a cloud VM, the
instance's credentials) and every machine of the LAN. gpulab's chain ``GPULAB-EGRESS``
(jumped to from ``DOCKER-USER`` for the projects' bridge and every build bridge
``gpb+``) holds, in order:

- replies to connections made to a project (a published port) pass;
- the networks the admin allows (``GPULAB_ALLOWED_NETWORKS``) pass;
- the host's DNS servers pass on port 53 (Docker's resolver in each container asks
  them from the container's own network: a LAN resolver refused is no names at all);
- the metadata addresses are refused, or pass with ``GPULAB_ALLOW_METADATA=1``;
- the refused networks (``GPULAB_REFUSED_NETWORKS``, by default the LAN's private
  and link-local ranges) are refused; everything else (the package index) passes.

The chain is written whole in one ``iptables-restore`` (never half a chain, however
often ``gpulab up`` runs); the jumps are checked (``-C``) before they are added. The
chain is the host's, so two hubs on one host share its contents (the last
``gpulab up``'s); its writers, in every process on the host, take one lock in turn
(:func:`writing`), so two hubs starting at once never add a jump twice or write over
each other's half. Where the host has no IPv6 tables, IPv6 is skipped and the doctor
says so (doctor/egress.py).
"""

from __future__ import annotations

import ipaddress
import logging
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from gpulab_hub import blocking, firewall, settings, settingvalues

log = logging.getLogger(__name__)

CHAIN = "GPULAB-EGRESS"
HOOK = "DOCKER-USER"  # Docker's chain for the admin's FORWARD rules
BUILD_IFACES = firewall.BUILD_IFACES  # every build bridge
# The cloud's instance metadata: AWS, GCP, Azure, Oracle, OpenStack and DigitalOcean
# answer at 169.254.169.254, AWS's container credentials at 169.254.170.2, Alibaba's
# at 100.100.100.200, AWS's over IPv6 at fd00:ec2::254.
METADATA = ("169.254.169.254/32", "169.254.170.2/32", "100.100.100.200/32", "fd00:ec2::254/128")
TOOLS = {4: "iptables", 6: "ip6tables"}
REJECT = {4: "icmp-admin-prohibited", 6: "icmp6-adm-prohibited"}
RESOLV_CONF = ("/etc/resolv.conf", "/run/systemd/resolve/resolv.conf")
_lock = threading.Lock()
_builds_done = False
_writing: blocking.file_lock | None = None
_writing_made = threading.Lock()


class EgressError(Exception):
    """The IPv4 rules could not be set; the message says what to do."""


@dataclass(frozen=True)
class Policy:
    """What projects and builds may reach (from the site's settings, settings.Egress)."""

    allow_metadata: bool = False
    refused: tuple[str, ...] = settingvalues.LAN_NETWORKS
    allowed: tuple[str, ...] = ()
    resolvers: tuple[str, ...] = ()  # the host's DNS servers: port 53 passes


def policy_of(s: settings.Settings, resolvers: tuple[str, ...] | None = None) -> Policy:
    e = s.egress
    found = host_resolvers() if resolvers is None else resolvers
    return Policy(e.allow_metadata, e.refused_networks, e.allowed_networks, found)


def host_resolvers(files=RESOLV_CONF) -> tuple[str, ...]:
    """The DNS servers Docker's resolver forwards to: the host's resolv.conf, or
    systemd-resolved's upstream list where that names only a loopback stub."""
    for path in files:
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        found = []
        for line in text.splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "nameserver":
                try:
                    ip = ipaddress.ip_address(parts[1].split("%")[0])
                except ValueError:
                    continue
                if not ip.is_loopback:
                    found.append(str(ip))
        if found:
            return tuple(dict.fromkeys(found))
    return ()


def _family(net: str) -> int:
    return ipaddress.ip_network(net, strict=False).version


def rules(policy: Policy, family: int) -> list[tuple[str, ...]]:
    """The chain's rules for one address family (4 or 6), in order."""
    mine = [str(ipaddress.ip_network(n, strict=False)) for n in policy.allowed]
    out: list[tuple[str, ...]] = [
        ("-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "RETURN")
    ]
    out += [("-d", n, "-j", "RETURN") for n in mine if _family(n) == family]
    for dns in policy.resolvers:
        if ipaddress.ip_address(dns).version == family:
            host = f"{dns}/{32 if family == 4 else 128}"
            out += [("-d", host, "-p", proto, "--dport", "53", "-j", "RETURN")
                    for proto in ("udp", "tcp")]  # fmt: skip
    refuse = ("-j", "REJECT", "--reject-with", REJECT[family])
    for n in METADATA:
        if _family(n) == family:
            out.append(("-d", n, "-j", "RETURN") if policy.allow_metadata else ("-d", n, *refuse))
    out += [("-d", n, *refuse) for n in policy.refused if _family(n) == family]
    return out


def restore_text(policy: Policy, family: int) -> str:
    """iptables-restore input that writes the chain whole (declaring it flushes it)."""
    lines = ["*filter", f":{CHAIN} - [0:0]"]
    lines += [" ".join(["-A", CHAIN, *r]) for r in rules(policy, family)]
    return "\n".join([*lines, "COMMIT", ""])


def _run(family: int, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    tool = TOOLS[family] + ("-restore" if stdin is not None else "")
    exe = shutil.which(tool)
    if not exe:
        raise FileNotFoundError(tool)
    return subprocess.run(
        [exe, "-w", "5", *args], input=stdin, capture_output=True, text=True, timeout=30
    )


def _ok(family: int, *args: str) -> bool:
    return _run(family, *args).returncode == 0


def _must(family: int, *args: str, stdin: str | None = None) -> None:
    done = _run(family, *args, stdin=stdin)
    if done.returncode != 0:
        what = " ".join(args) if stdin is None else "-restore --noflush"
        raise RuntimeError(f"{TOOLS[family]} {what} failed: {done.stderr.strip()}")


def hook_chain(family: int) -> str:
    """Where the jumps go: Docker's DOCKER-USER, or (IPv6 on an engine that keeps no
    IPv6 rules) FORWARD itself."""
    if family == 6 and not _ok(6, "-n", "-L", HOOK):
        return "FORWARD"
    if not _ok(family, "-n", "-L", HOOK):
        _must(family, "-N", HOOK)
    return HOOK


def _jump(iface: str) -> tuple[str, ...]:
    return ("-i", iface, "-j", CHAIN)


def _write(family: int, policy: Policy | None, ifaces: tuple[str, ...]) -> None:
    """The chain (written whole when ``policy`` is given; else made with the default
    policy only where missing) and a jump to it for each interface."""
    if policy is not None or not _ok(family, "-n", "-L", CHAIN):
        _must(family, "--noflush", stdin=restore_text(policy or default_policy(), family))
    hook = hook_chain(family)
    for iface in ifaces:
        if not _ok(family, "-C", hook, *_jump(iface)):
            _must(family, "-I", hook, "1", *_jump(iface))


def lock_path() -> Path:
    """The host's one lock file for gpulab's chain (``/run/lock``, where the host has it)."""
    run_lock = Path("/run/lock")
    folder = run_lock if run_lock.is_dir() else Path(tempfile.gettempdir())
    return folder / "gpulab-egress.lock"


def writing() -> blocking.file_lock:
    """The host-wide lock of gpulab's chain, re-entrant in a thread: every write takes
    it, and whoever must see the chain unchanged for a while (a test that widens it
    for a moment) holds it across."""
    global _writing
    with _writing_made:
        if _writing is None:
            _writing = blocking.file_lock(lock_path(), "the host's egress rules", timeout=60)
        return _writing


def _apply(policy: Policy | None, ifaces: tuple[str, ...]) -> str:
    """Both families, under :func:`writing`; returns why IPv6 was skipped ("" when it
    was not)."""
    with writing():
        return _apply_locked(policy, ifaces)


def _apply_locked(policy: Policy | None, ifaces: tuple[str, ...]) -> str:
    try:
        _write(4, policy, ifaces)
    except (FileNotFoundError, RuntimeError, subprocess.TimeoutExpired) as e:
        raise EgressError(
            "gpulab could not keep projects and builds off the cloud's metadata service and "
            f"the LAN ({e}). It needs iptables (apt-get install iptables) and runs as root "
            '(docs/security.md, "Beyond the box").'
        ) from e
    try:
        _write(6, policy, ifaces)
    except (FileNotFoundError, RuntimeError, subprocess.TimeoutExpired) as e:
        log.warning("gpulab: no IPv6 rules for projects and builds (%s); `gpulab doctor`", e)
        return str(e)
    return ""


def default_policy() -> Policy:
    return policy_of(settings.DEFAULT)


def ensure(policy: Policy, bridge: str) -> str:
    """``gpulab up``: the chain holds ``policy``, and the projects' bridge and every
    build bridge jump to it. Returns why IPv6 was skipped ("" when it was not)."""
    return _apply(policy, (bridge, BUILD_IFACES))


def ensure_builds() -> None:
    """Before a build, once per process: build bridges jump to the chain (made with the
    default policy if ``gpulab up`` has not written it: never a build without it)."""
    global _builds_done
    with _lock:
        if not _builds_done:
            _apply(None, (BUILD_IFACES,))
            _builds_done = True


def forget(bridge: str) -> None:
    """The jumps of a removed projects' network (tests; the chain stays)."""
    with writing():
        _forget_locked(bridge)


def _forget_locked(bridge: str) -> None:
    for family in (4, 6):
        try:
            hook = hook_chain(family)
            while _ok(family, "-D", hook, *_jump(bridge)):
                pass
        except (FileNotFoundError, RuntimeError, subprocess.TimeoutExpired):
            continue
