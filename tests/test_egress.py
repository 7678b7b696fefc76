"""What projects and builds may reach beyond the box (egress.py): the rules the site's
settings make, and what the doctor reads from the host's rules (doctor/egress.py).
The rules on a real host, attacked: tests/security/test_beyond_the_box.py."""

from __future__ import annotations

import pytest

from gpulab_hub import egress, settings, settingvalues
from gpulab_hub.doctor import egress as doctor
from gpulab_hub.doctor.findings import FAIL, OK, WARN

REJECT4 = ("-j", "REJECT", "--reject-with", "icmp-admin-prohibited")


def test_by_default_the_metadata_service_and_the_lan_are_refused_but_dns_passes():
    p = egress.policy_of(settings.DEFAULT, resolvers=("10.255.255.53", "fd00::53"))
    assert egress.rules(p, 4) == [
        ("-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "RETURN"),
        ("-d", "10.255.255.53/32", "-p", "udp", "--dport", "53", "-j", "RETURN"),
        ("-d", "10.255.255.53/32", "-p", "tcp", "--dport", "53", "-j", "RETURN"),
        ("-d", "169.254.169.254/32", *REJECT4),
        ("-d", "169.254.170.2/32", *REJECT4),
        ("-d", "100.100.100.200/32", *REJECT4),
        *[("-d", n, *REJECT4) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                         "100.64.0.0/10", "169.254.0.0/16")],
    ]  # fmt: skip
    six = egress.rules(p, 6)
    assert (
        "-d",
        "fd00:ec2::254/128",
        "-j",
        "REJECT",
        "--reject-with",
        "icmp6-adm-prohibited",
    ) in six
    assert ("-d", "fd00::53/128", "-p", "udp", "--dport", "53", "-j", "RETURN") in six
    assert not any("10.0.0.0/8" in r for r in six)
    text = egress.restore_text(p, 4)
    assert text.startswith(f"*filter\n:{egress.CHAIN} - [0:0]\n") and text.endswith("COMMIT\n")


def test_what_the_admin_allows_passes_before_any_refusal():
    s = settings.parse(
        {
            "GPULAB_ALLOW_METADATA": "1",
            "GPULAB_ALLOWED_NETWORKS": "10.1.2.3, 192.168.7.0/24",
            "GPULAB_REFUSED_NETWORKS": "lan,198.51.100.0/24",
        }
    )
    r = egress.rules(egress.policy_of(s, resolvers=()), 4)
    first_refusal = next(i for i, rule in enumerate(r) if "REJECT" in rule)
    passing = [rule[1] for rule in r[:first_refusal] if rule[0] == "-d"]
    assert passing == ["10.1.2.3/32", "192.168.7.0/24", "169.254.169.254/32",
                       "169.254.170.2/32", "100.100.100.200/32"]  # fmt: skip
    assert ("-d", "198.51.100.0/24", *REJECT4) in r


def test_the_networks_settings_read_lan_none_and_refuse_nonsense():
    assert settings.DEFAULT.egress.refused_networks == settingvalues.LAN_NETWORKS
    assert settings.parse({"GPULAB_REFUSED_NETWORKS": "none"}).egress.refused_networks == ()
    got = settings.parse({"GPULAB_ALLOWED_NETWORKS": "10.0.0.7/8, fd00:ec2::254"})
    assert got.egress.allowed_networks == ("10.0.0.0/8", "fd00:ec2::254/128")
    with pytest.raises(ValueError, match="GPULAB_ALLOWED_NETWORKS.*'10.1.2.300'"):
        settings.parse({"GPULAB_ALLOWED_NETWORKS": "10.1.2.300"})
    # none still refuses the metadata service
    bare = egress.policy_of(settings.parse({"GPULAB_REFUSED_NETWORKS": "none"}), resolvers=())
    assert ("-d", "169.254.169.254/32", *REJECT4) in egress.rules(bare, 4)


def test_the_dns_servers_are_the_hosts_and_a_loopback_stub_reads_resolveds(tmp_path):
    stub, upstream = tmp_path / "resolv.conf", tmp_path / "resolved.conf"
    stub.write_text("# systemd-resolved\nnameserver 127.0.0.53\noptions edns0\n")
    upstream.write_text("nameserver 10.0.0.2\nnameserver fe80::1%eth0\nnameserver 10.0.0.2\n")
    assert egress.host_resolvers((stub, upstream)) == ("10.0.0.2", "fe80::1")
    stub.write_text("nameserver 192.168.1.1\n")
    assert egress.host_resolvers((stub, upstream)) == ("192.168.1.1",)
    assert egress.host_resolvers((tmp_path / "none",)) == ()


# What `iptables -S` printed on a host after `gpulab up` (shortened).
LISTING = """-P FORWARD DROP
-N DOCKER-USER
-N GPULAB-EGRESS
-A FORWARD -j DOCKER-USER
-A DOCKER-USER -i gpb+ -j GPULAB-EGRESS
-A DOCKER-USER -i br-6d2e11f7d0c8 -j GPULAB-EGRESS
-A DOCKER-USER -j RETURN
-A GPULAB-EGRESS -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN
-A GPULAB-EGRESS -d 10.255.255.53/32 -p udp -m udp --dport 53 -j RETURN
-A GPULAB-EGRESS -d 169.254.169.254/32 -j REJECT --reject-with icmp-admin-prohibited
-A GPULAB-EGRESS -d 10.0.0.0/8 -j REJECT --reject-with icmp-admin-prohibited
"""
BRIDGE = "br-6d2e11f7d0c8"
E = settings.DEFAULT.egress


def test_the_doctor_reports_the_rule_present_missing_or_allowed_by_the_admin():
    ok = doctor.check(4, LISTING, "", BRIDGE, E)
    assert (ok.id, ok.status) == ("security.metadata", OK) and "169.254.169.254" in ok.seen
    # another hub's network (or one made after the rules): its projects are not covered
    other = doctor.check(4, LISTING, "", "br-0123456789ab", E)
    assert other.status == FAIL and "br-0123456789ab" in other.seen and "gpulab up" in other.fix
    no_rule = LISTING.replace("-d 169.254.169.254/32 -j REJECT", "-d 169.254.169.254/32 -j X")
    assert doctor.check(4, no_rule, "", BRIDGE, E).status == FAIL
    no_hook = LISTING.replace("-A FORWARD -j DOCKER-USER\n", "")
    assert "FORWARD" in doctor.check(4, no_hook, "", BRIDGE, E).seen
    allowed = LISTING.replace(
        "-A GPULAB-EGRESS -d 169.254.169.254/32 -j REJECT",
        "-A GPULAB-EGRESS -d 169.254.0.0/16 -j RETURN\n-A GPULAB-EGRESS -d 169.254.169.254/32 -j REJECT",  # noqa: E501
    )
    admin = doctor.check(4, allowed, "", BRIDGE, E)
    assert admin.status == WARN and admin.seen.startswith("allowed by the admin")


def test_the_doctor_says_when_the_host_has_no_ipv6_tables():
    f = doctor.check(6, None, "ip6tables: can't initialize ip6tables table `filter'", BRIDGE, E)
    assert (f.id, f.status) == ("security.metadata6", WARN)
    assert "can't initialize" in f.seen and "ip6tables" in f.fix
    assert doctor.check(4, None, "iptables is not installed", BRIDGE, E).status == FAIL
