"""Which peers a project's server on a Slurm node answers (issue 23): the spawner hands
the server the hub's addresses (``GPULAB_HUB_PEERS``, read by gpulab_jupyter.hubpeers;
tests/test_hub_peers.py shows a real server refusing everyone else)."""

from __future__ import annotations

import pytest
from test_cluster_spawner_units import spawner_of

from gpulab_contract.environment import HUB_PEERS as HUB_PEERS_ENV
from gpulab_hub.cluster import ClusterError
from gpulab_hub.spawner import ProjectSpawner


def test_the_server_is_told_the_hubs_address_for_the_nodes():
    sp = spawner_of("alice", "one")
    assert sp._hub_peers() == "10.0.0.1"  # the hub's API address
    sp.hub_address_for_nodes = "10.1.0.1:9000"
    assert sp._hub_peers() == "10.1.0.1"
    sp.hub_address_for_nodes = "localhost"  # a name is resolved
    assert sp._hub_peers() == "127.0.0.1"
    sp.hub_peer_addresses = ["10.1.0.1", "10.1.0.9"]  # the proxy's machine too
    assert sp._hub_peers() == "10.1.0.1,10.1.0.9"


@pytest.mark.parametrize("value", ["10.1.0.0/24", "head", "10.1.0.1,10.6.6.6", "", "::1"])
def test_peer_addresses_other_than_ipv4_are_refused(value):
    sp = spawner_of("alice", "one")
    sp.hub_peer_addresses = [value]
    with pytest.raises(ClusterError, match="not an IPv4 address"):
        sp._hub_peers()


def test_a_hub_address_that_resolves_to_nothing_refuses_to_start():
    sp = spawner_of("alice", "one")
    sp.hub_address_for_nodes = "no-such-host.invalid"
    with pytest.raises(ClusterError, match="hub_peer_addresses"):
        sp._hub_peers()


def test_the_containers_environment_carries_the_peers(monkeypatch):
    monkeypatch.setattr(ProjectSpawner, "get_env", lambda self: {"JUPYTERHUB_API_TOKEN": "t"})
    sp = spawner_of("alice", "one")
    sp.hub_peer_addresses = ["10.1.0.7"]
    assert sp.get_env()[HUB_PEERS_ENV] == "10.1.0.7"
