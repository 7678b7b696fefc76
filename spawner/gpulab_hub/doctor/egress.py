"""Whether projects and builds are kept off the cloud's metadata service and the LAN
(gpulab_hub.egress): read from the host's rules (``iptables -S``, ``ip6tables -S``).

:func:`check` is a pure function of those listings, tested with recorded ones;
:func:`findings` reads them.
"""

from __future__ import annotations

import ipaddress
import re
import shutil
import subprocess

import docker.errors

from gpulab_hub import egress, firewall, settings
from gpulab_hub.doctor.findings import FAIL, OK, WARN, Finding

RERUN = 'Run `gpulab up` (it sets them; docs/security.md, "Beyond the box").'
FAMILY = {4: ("security.metadata", "169.254.169.254"), 6: ("security.metadata6", "fd00:ec2::254")}


def _rule(listing: str, *parts: str) -> bool:
    """Whether ``iptables -S`` printed a rule containing ``parts`` in order."""
    wanted = " ".join(parts)
    return any(wanted in line for line in listing.splitlines() if line.startswith("-A "))


def check(family: int, listing: str | None, why: str, bridge: str | None, e) -> Finding:
    """One family's finding. ``listing``: ``iptables -S`` (or ``ip6tables -S``), None
    where unreadable (``why`` says what happened); ``bridge``: the projects' bridge
    (None: no network yet); ``e``: the site's settings.Egress."""
    fid, address = FAMILY[family]
    net = f"{address}/{32 if family == 4 else 128}"
    if listing is None:
        if family == 6:
            return Finding(
                fid,
                WARN,
                f"no IPv6 rules could be read here ({why}): gpulab sets none, so a project "
                "on an IPv6 network would reach the metadata service's IPv6 address and the "
                "LAN's",
                "Install ip6tables (apt-get install iptables) and run `gpulab up` again; "
                "without IPv6 on Docker's networks, nothing is reached over IPv6 meanwhile.",
            )
        return Finding(fid, FAIL, f"gpulab's rules could not be read ({why})", RERUN)
    chain = egress.CHAIN
    hooked = {firewall.BUILD_IFACES: "the build bridges' jump", bridge: "the projects' bridge's"}
    missing = [
        f"{what} ({iface})"
        for iface, what in hooked.items()
        if iface and not _rule(listing, "-i", iface, "-j", chain)
    ]
    if family == 4 and not _rule(listing, "-A FORWARD -j", egress.HOOK):
        missing.append(f"FORWARD's jump to {egress.HOOK}")
    passing = re.findall(rf"^-A {chain} -d (\S+) -j RETURN$", listing, re.M)
    target = ipaddress.ip_address(address)
    if any(target in ipaddress.ip_network(n, strict=False) for n in passing):
        return Finding(
            fid,
            WARN,
            f"allowed by the admin: projects and builds reach the cloud's metadata service "
            f"({address}; GPULAB_ALLOW_METADATA=1 or GPULAB_ALLOWED_NETWORKS): on a cloud VM, "
            "the instance's credentials",
            "Set GPULAB_ALLOW_METADATA=0 (and leave the address out of GPULAB_ALLOWED_NETWORKS) "
            "unless projects need the instance's identity, then run `gpulab up` again.",
        )
    if missing or not _rule(listing, f"-A {chain} -d {net} -j REJECT"):
        gaps = ", ".join(missing) or f"the rule refusing {address}"
        return Finding(
            fid,
            FAIL,
            f"projects and builds can reach the cloud's metadata service ({address}) and the "
            f"LAN: gpulab's rule is missing ({gaps})",
            RERUN,
        )
    refused = [n for n in e.refused_networks if egress._family(n) == family]
    allowed = [n for n in e.allowed_networks if egress._family(n) == family]
    return Finding(
        fid,
        OK,
        f"project containers and builds are refused the cloud's metadata service ({address})"
        + (f" and {', '.join(refused)}" if refused else "")
        + (f"; the admin allows {', '.join(allowed)}" if allowed else ""),
    )


def read(family: int) -> tuple[str | None, str]:
    """(``iptables -S`` of the filter table, or None; why not)."""
    tool = shutil.which(egress.TOOLS[family])
    if not tool:
        return None, f"{egress.TOOLS[family]} is not installed"
    try:
        done = subprocess.run([tool, "-w", "5", "-S"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, str(e)
    if done.returncode != 0:
        return None, done.stderr.strip() or f"exit code {done.returncode}"
    return done.stdout, ""


def findings(dk, network_name: str, environ) -> list[Finding]:
    """Both families' findings, for the projects' network ``network_name``."""
    try:
        bridge = firewall.bridge_of(dk.call("inspect_network", network_name))
    except docker.errors.NotFound:
        bridge = None
    e = settings.parse(environ).egress
    return [check(family, *read(family), bridge, e) for family in (4, 6)]
