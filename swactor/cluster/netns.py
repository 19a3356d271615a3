"""`NetnsTopology`: test hosts in Linux network namespaces, joined by a bridge.

Theory of operation. A topology is a list of host names plus a private IPv4 subnet the
caller chooses. `create()` makes one namespace per host and one hub namespace that holds
a Linux bridge (`br0`); each host gets a veth pair whose host end (`eth0`, the given
MTU, the host's address on the subnet) lives in the host namespace and whose other end
is enslaved to the bridge in the hub. Every link is created directly inside the
namespaces (`ip -n HUB link add ... peer name eth0 netns HOST`), so nothing — no link,
address or route — is ever added to the namespace the caller runs in: the hosts can
reach each other and nothing else.

Hosts are numbered in the order given; host i gets the (i+1)-th address of the subnet,
unless `addresses` names a host's address (which must lie on the subnet).
`Host.argv(cmd)` wraps a command in `ip netns exec`, so the process it starts (and its
children) see only that host's network.

Teardown always runs (`destroy()`, also on `__exit__`, also when `create()` fails half
way): each namespace's remaining processes — only processes inside this topology's
namespaces, which the caller started — are killed by pid and reaped, then the
namespaces are deleted; deleting the hub removes the bridge and every veth with it.
`destroy()` is idempotent and returns what it had to kill, so a test can assert that
its processes had already exited on their own.

Namespace names are `swm<pid>-<tag>-<host>`: `sweep_stale()` removes namespaces of
this form whose creating process is gone (a crashed earlier test), never any other.
Needs root and iproute2 (`available()` says why not).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType

PREFIX = "swm"
BRIDGE = "br0"
HOST_DEVICE = "eth0"
KILL_WAIT_S = 10.0
_NAME = re.compile(rf"^{PREFIX}(\d+)-[a-z0-9]+-[a-z0-9]+$")


class NetnsError(Exception):
    """A namespace command failed; the message names the command and its error."""


def available() -> str | None:
    """None when namespaces can be made here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    return None


def ip(*args: str) -> str:
    """Run `ip ARGS`; its stdout, or NetnsError naming the command and its stderr."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def namespaces() -> list[str]:
    """Names of the network namespaces `ip netns` knows."""
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def namespace_pids(netns: str) -> list[int]:
    """Pids of the processes inside a namespace (empty when it is gone)."""
    done = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True,
                          check=False)
    return [int(pid) for pid in done.stdout.split() if pid.isdigit()]


@dataclass(frozen=True)
class Host:
    """One test host: its name, its namespace and its address on the subnet."""

    name: str
    netns: str
    address: str

    def argv(self, command: Sequence[str]) -> list[str]:
        """`command` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.netns, *command]


@dataclass
class NetnsTopology:
    """Hosts on one bridged test subnet (module doc)."""

    names: Sequence[str]
    subnet: ipaddress.IPv4Network
    mtu: int = 1500
    addresses: Mapping[str, str] = field(default_factory=dict)
    tag: str = field(default_factory=lambda: f"{time.monotonic_ns() % 36**4:x}")
    hosts: dict[str, Host] = field(default_factory=dict, init=False)
    hub: str = field(default="", init=False)
    _made: list[str] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if len(set(self.names)) != len(self.names) or not self.names:
            raise NetnsError(f"host names must be distinct and non-empty: {list(self.names)}")
        bad = [n for n in self.names if not re.fullmatch(r"[a-z0-9]{1,8}", n)]
        if bad:
            raise NetnsError(f"host names must be 1-8 of [a-z0-9]: {bad}")
        if self.subnet.num_addresses - 2 < len(self.names):
            raise NetnsError(f"subnet {self.subnet} has no room for {len(self.names)} hosts")
        if not self.subnet.is_private:
            raise NetnsError(f"subnet {self.subnet} is not a private range")
        base = f"{PREFIX}{os.getpid()}-{self.tag}"
        self.hub = f"{base}-hub"
        fixed = {name: ipaddress.IPv4Address(a) for name, a in self.addresses.items()}
        outside = [f"{n}={a}" for n, a in fixed.items()
                   if n not in self.names or a not in self.subnet
                   or a in (self.subnet.network_address, self.subnet.broadcast_address)]
        if outside or len(set(fixed.values())) != len(fixed):
            raise NetnsError(f"addresses must be distinct host addresses of {self.subnet} "
                             f"for named hosts: {outside or dict(self.addresses)}")
        free = (a for a in self.subnet.hosts() if a not in fixed.values())
        for name in self.names:
            address = fixed[name] if name in fixed else next(free)
            self.hosts[name] = Host(name, f"{base}-{name}", str(address))

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def create(self) -> NetnsTopology:
        """Make the hub, the bridge and every host (destroying all of it on failure)."""
        try:
            self._add_namespace(self.hub)
            ip("-n", self.hub, "link", "add", BRIDGE, "type", "bridge")
            ip("-n", self.hub, "link", "set", BRIDGE, "up")
            for index, host in enumerate(self.hosts.values()):
                self._add_namespace(host.netns)
                port = f"p{index}"
                ip("-n", self.hub, "link", "add", port, "mtu", str(self.mtu), "type", "veth",
                   "peer", "name", HOST_DEVICE, "netns", host.netns)
                ip("-n", self.hub, "link", "set", port, "master", BRIDGE, "up")
                ip("-n", host.netns, "link", "set", "lo", "up")
                ip("-n", host.netns, "addr", "add",
                   f"{host.address}/{self.subnet.prefixlen}", "dev", HOST_DEVICE)
                ip("-n", host.netns, "link", "set", HOST_DEVICE, "mtu", str(self.mtu), "up")
        except BaseException:
            self.destroy()
            raise
        return self

    def _add_namespace(self, netns: str) -> None:
        ip("netns", "add", netns)
        self._made.append(netns)

    def set_link(self, name: str, up: bool) -> None:
        """Cut (or restore) one host's link to the bridge, as a pulled cable would."""
        index = list(self.hosts).index(name)
        ip("-n", self.hub, "link", "set", f"p{index}", "up" if up else "down")

    def pids(self, name: str) -> list[int]:
        """Processes running inside one host."""
        return namespace_pids(self.hosts[name].netns)

    def destroy(self) -> dict[str, list[int]]:
        """Kill what still runs inside, delete every namespace; {host: pids killed}."""
        killed: dict[str, list[int]] = {}
        by_netns = {host.netns: host.name for host in self.hosts.values()}
        for netns in self._made:
            pids = _kill_all(netns)
            if pids:
                killed[by_netns.get(netns, netns)] = pids
        errors = []
        for netns in reversed(self._made):
            try:
                ip("netns", "del", netns)
            except NetnsError as error:
                errors.append(str(error))
        self._made.clear()
        if errors:
            raise NetnsError("; ".join(errors))
        return killed

    def __enter__(self) -> NetnsTopology:
        return self.create()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.destroy()


def _kill_all(netns: str) -> list[int]:
    """SIGKILL every process inside `netns` and wait until none is left; their pids."""
    pids = namespace_pids(netns)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    while namespace_pids(netns) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids


def sweep_stale() -> list[str]:
    """Delete `swm<pid>-...` namespaces whose creator pid is gone; their names."""
    removed = []
    for netns in namespaces():
        match = _NAME.match(netns)
        if match is None or _alive(int(match.group(1))):
            continue
        _kill_all(netns)
        with contextlib.suppress(NetnsError):
            ip("netns", "del", netns)
            removed.append(netns)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
