"""gpulab's iptables rules for the projects' network (firewall.py), on this machine's
real iptables: two hubs on one network keep each its port open; `gpulab down` closes
its own port only; a changed port never leaves the DROP before it."""

from __future__ import annotations

import subprocess

import pytest

from gpulab_hub import firewall

IFACE = "gltestfw0"  # no such interface: the rules match nothing on this machine
CHAIN = f"GPULAB-{IFACE}"


def rules() -> list[str]:
    out = subprocess.run(["iptables", "-S", CHAIN], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.startswith("-A ")]


@pytest.fixture
def clean():
    yield
    subprocess.run(["iptables", "-D", firewall.CHAIN, "-i", IFACE, "-j", CHAIN], check=False)
    subprocess.run(["iptables", "-F", CHAIN], check=False)
    subprocess.run(["iptables", "-X", CHAIN], check=False)


def test_each_hubs_port_stays_open_until_its_own_down(clean):
    firewall.ensure_projects(IFACE, 18081)
    firewall.ensure_projects(IFACE, 18082)  # a second hub on the same network
    firewall.ensure_projects(IFACE, 18081)  # `gpulab up` again: nothing doubled
    assert rules() == [
        f"-A {CHAIN} -p tcp -m tcp --dport 18082 -j RETURN",
        f"-A {CHAIN} -p tcp -m tcp --dport 18081 -j RETURN",
        f"-A {CHAIN} -j DROP",
    ]
    firewall.forget_projects_port(IFACE, 18082)
    assert rules() == [f"-A {CHAIN} -p tcp -m tcp --dport 18081 -j RETURN", f"-A {CHAIN} -j DROP"]
    out = subprocess.run(["iptables", "-S", "INPUT"], capture_output=True, text=True).stdout
    assert out.splitlines()[1] == f"-A INPUT -j {firewall.CHAIN}"  # first in INPUT
    base = subprocess.run(["iptables", "-S", firewall.CHAIN], capture_output=True, text=True)
    assert f"-A {firewall.CHAIN} -i gpb+ -j DROP" in base.stdout


@pytest.mark.parametrize("bad", ["", "eth0; rm", "a" * 16, "-j"])
def test_interface_names_are_checked(bad):
    with pytest.raises(firewall.FirewallError):
        firewall.ensure_projects(bad, 18081)
