"""`NetnsTopology` on its own (fast): hosts reach each other over the bridge and only
on their own subnet, a downed port cuts one host off, teardown kills leftovers and
removes every namespace (also when creation fails half way), `sweep_stale` removes only
namespaces of dead creators, bad arguments are typed errors."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys

import pytest

from swactor.cluster import netns
from swactor.cluster.netns import NetnsError, NetnsTopology

needs_root = pytest.mark.skipif(netns.available() is not None,
                                reason=str(netns.available()))
pytestmark = [pytest.mark.timeout(120)]
SUBNET = ipaddress.IPv4Network(f"10.{200 + os.getpid() % 50}.{(os.getpid() + 2) % 250}.0/24")

# a UDP echo in one host; the other sends one datagram and prints what came back
ECHO = ("import socket,sys; s=socket.socket(2,2); s.bind((sys.argv[1],9000)); "
        "print('bound', flush=True); d,a=s.recvfrom(64); s.sendto(d[::-1],a)")
SEND = ("import socket,sys; s=socket.socket(2,2); s.settimeout(1.5); "
        "s.sendto(b'ping',(sys.argv[1],9000)); print(s.recvfrom(64)[0].decode())")


def udp_round_trip(hosts: NetnsTopology, sender: str, receiver: str) -> str:
    """What `sender` got back from an echo in `receiver` ('' when nothing came)."""
    target = hosts[receiver].address
    echo = subprocess.Popen(hosts[receiver].argv([sys.executable, "-c", ECHO, target]),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert echo.stdout is not None and echo.stdout.readline() == "bound\n"
        done = subprocess.run(hosts[sender].argv([sys.executable, "-c", SEND, target]),
                              capture_output=True, text=True, check=False)
        assert done.returncode == 0 or "timed out" in done.stderr, done.stderr
        return done.stdout.strip()
    finally:
        echo.kill()
        echo.wait()


def names_of(hosts: NetnsTopology) -> set[str]:
    return {hosts.hub, *(host.netns for host in hosts.hosts.values())}


@pytest.mark.multihost
@needs_root
def test_hosts_reach_each_other_until_a_port_goes_down() -> None:
    hosts = NetnsTopology(["a", "b", "c"], SUBNET, mtu=1400)
    with hosts:
        assert names_of(hosts) <= set(netns.namespaces())
        assert [h.address for h in hosts.hosts.values()] == [
            str(SUBNET.network_address + i) for i in (1, 2, 3)]
        shown = subprocess.run(["ip", "-n", hosts["b"].netns, "-o", "addr", "show", "eth0"],
                               capture_output=True, text=True, check=True).stdout
        assert f"{hosts['b'].address}/24" in shown
        assert "mtu 1400" in netns.ip("-n", hosts["b"].netns, "link", "show", "eth0")
        routes = netns.ip("-n", hosts["b"].netns, "-4", "route", "show").split("\n")
        assert [r.split()[0] for r in routes if r] == [str(SUBNET)]  # no way out
        assert udp_round_trip(hosts, "a", "c") == "gnip"
        hosts.set_link("c", up=False)
        assert udp_round_trip(hosts, "a", "c") == ""
        assert udp_round_trip(hosts, "a", "b") == "gnip"
        hosts.set_link("c", up=True)
        assert udp_round_trip(hosts, "a", "c") == "gnip"
    assert names_of(hosts).isdisjoint(netns.namespaces())


@pytest.mark.multihost
@needs_root
def test_destroy_kills_leftovers_and_is_idempotent() -> None:
    hosts = NetnsTopology(["a"], SUBNET).create()
    try:
        sleeper = subprocess.Popen(hosts["a"].argv(["sleep", "300"]))
        for _ in range(100):
            if hosts.pids("a"):
                break
            subprocess.run(["sleep", "0.05"], check=True)
        assert hosts.pids("a") == [sleeper.pid]
        assert hosts.destroy() == {"a": [sleeper.pid]}
        assert sleeper.wait(5) == -9
        assert hosts.destroy() == {}
    finally:
        hosts.destroy()
    assert names_of(hosts).isdisjoint(netns.namespaces())


@pytest.mark.multihost
@needs_root
def test_a_failed_create_removes_what_it_made() -> None:
    hosts = NetnsTopology(["a", "b"], SUBNET, mtu=70000)  # no veth takes that MTU
    with pytest.raises(NetnsError, match="mtu"):
        hosts.create()
    assert names_of(hosts).isdisjoint(netns.namespaces())


@pytest.mark.multihost
@needs_root
def test_sweep_removes_only_namespaces_of_dead_creators() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale, live = f"swm{gone.pid}-t0-x", f"swm{os.getpid()}-t0-x"
    for name in (stale, live):
        netns.ip("netns", "add", name)
    try:
        removed = netns.sweep_stale()
        assert stale in removed and live not in removed
        assert stale not in netns.namespaces() and live in netns.namespaces()
    finally:
        for name in (stale, live):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


@pytest.mark.parametrize(("names", "subnet", "message"), [
    (["a", "a"], "10.9.9.0/24", "distinct"),
    ([], "10.9.9.0/24", "distinct"),
    (["Bad_Name"], "10.9.9.0/24", "1-8"),
    (["a", "b", "c"], "10.9.9.0/30", "no room"),
    (["a"], "8.8.8.0/24", "not a private range"),
])
def test_bad_arguments_are_typed_errors(names: list[str], subnet: str, message: str) -> None:
    with pytest.raises(NetnsError, match=message):
        NetnsTopology(names, ipaddress.IPv4Network(subnet))


def test_named_addresses_are_kept_and_the_rest_fill_in() -> None:
    hosts = NetnsTopology(["a", "b", "c"], ipaddress.IPv4Network("172.28.0.0/24"),
                          addresses={"b": "172.28.0.1", "c": "172.28.0.13"})
    assert {n: h.address for n, h in hosts.hosts.items()} == {
        "a": "172.28.0.2", "b": "172.28.0.1", "c": "172.28.0.13"}
    for addresses, bad in (({"a": "10.0.0.1"}, "a=10.0.0.1"), ({"z": "172.28.0.5"}, "z="),
                           ({"a": "172.28.0.255"}, "a=172.28.0.255"),
                           ({"a": "172.28.0.5", "b": "172.28.0.5"}, "distinct")):
        with pytest.raises(NetnsError, match=bad):
            NetnsTopology(["a", "b"], ipaddress.IPv4Network("172.28.0.0/24"),
                          addresses=addresses)
