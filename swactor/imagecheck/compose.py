"""Run a compose file's services from a replayed image, without a Docker engine.

Theory of operation. `load(path)` reads the compose file (YAML anchors and merge keys
resolved) into `Service`s: for each, the command a container would run (the service's
`entrypoint`, else the image's ENTRYPOINT, followed by its `command`, else the image's
CMD when the entrypoint is the image's), its environment, user and working directory,
its named volumes and bind mounts, its address on the one network, and what it waits
for (`depends_on` with `service_started` or `service_completed_successfully`). Compose
interpolation is refused except `$$`, which becomes `$`; a key this module does not
know is refused by name rather than ignored, so a change to the compose file that the
runner would not honour fails the check. Every service's `build` must name the
Dockerfile that was replayed.

`Topology.run(target)` gives every service a container: an overlay over the image's
layers (its own writable layer, as a Docker container has), the host's /proc, /dev and
/sys, a fresh anonymous volume for each image VOLUME the service does not mount over
(filled from the image, as Docker fills a new volume), the named volumes (shared
folders, filled from the image on first use) and binds. Each container is a Linux
network namespace on one bridge with the service's `ipv4_address` on the network's
subnet (`swactor.cluster.netns`; a service without one gets a free address): the
network has no route out, like the compose file's `internal: true` network. Services
start in dependency order; each process is `ip netns exec NS` + `enter.py` (chroot,
user, directory, environment). The run ends when the target service exits: its exit
status, stdout and stderr are the result; the other services then get SIGTERM, and
every namespace, mount and container layer is removed, also on failure.
"""

from __future__ import annotations

import ipaddress
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from swactor.cluster import netns
from swactor.cluster.netns import NetnsTopology
from swactor.imagecheck.replay import Image, inside_root, launcher
from swactor.imagecheck.rootfs import Mounts, remove_tree

SERVICE_KEYS = frozenset({"image", "build", "volumes", "networks", "depends_on", "entrypoint",
                          "command", "restart", "environment", "user", "working_dir"})
TOP_KEYS = frozenset({"name", "services", "networks", "volumes"})
NETWORK_KEYS = frozenset({"internal", "ipam", "driver"})
STOP_WAIT_S = 30.0


class ComposeError(Exception):
    """The compose file holds something the runner does not honour, or a service failed."""


@dataclass(frozen=True)
class Mount:
    source: str  # a named volume, or an absolute host path for a bind
    target: str
    named: bool
    read_only: bool


@dataclass(frozen=True)
class Service:
    name: str
    argv: tuple[str, ...]
    env: dict[str, str]
    user: str
    workdir: str
    mounts: tuple[Mount, ...]
    address: str | None
    depends: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Compose:
    services: dict[str, Service]
    subnet: ipaddress.IPv4Network
    volumes: tuple[str, ...]


def _unescape(value: object, where: str) -> str:
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise ComposeError(f"{where}: expected a string, got {value!r}")
    text = str(value)
    rest = text.replace("$$", "")
    if "$" in rest:
        raise ComposeError(f"{where}: compose interpolation is not replayed: {text!r}")
    return text.replace("$$", "$")


def _argv(value: object, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(shlex.split(_unescape(value, where)))
    if isinstance(value, list):
        return tuple(_unescape(v, where) for v in value)
    raise ComposeError(f"{where}: expected a list or a string, got {value!r}")


def load(path: Path, image: Image, dockerfile: Path) -> Compose:
    """The compose file's services as containers of `image` (module doc)."""
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ComposeError(f"{path}: not a mapping")
    unknown = [k for k in data if k not in TOP_KEYS and not str(k).startswith("x-")]
    if unknown:
        raise ComposeError(f"{path}: top-level keys not replayed: {unknown}")
    networks = data.get("networks") or {}
    if not isinstance(networks, dict) or len(networks) != 1:
        raise ComposeError(f"{path}: expected exactly one network, got {list(networks)}")
    (net_name, net), = networks.items()
    net = net or {}
    bad = [k for k in net if k not in NETWORK_KEYS]
    if bad or net.get("driver", "bridge") != "bridge":
        raise ComposeError(f"network {net_name}: keys not replayed: {bad or ['driver']}")
    configs = (net.get("ipam") or {}).get("config") or []
    if len(configs) != 1 or "subnet" not in configs[0]:
        raise ComposeError(f"network {net_name}: expected one ipam subnet")
    subnet = ipaddress.IPv4Network(configs[0]["subnet"])
    volumes = tuple(data.get("volumes") or {})
    services = {}
    for name, spec in (data.get("services") or {}).items():
        services[name] = _service(path, str(name), spec, image, dockerfile, net_name, volumes)
    if not services:
        raise ComposeError(f"{path}: no services")
    for service in services.values():
        for dep, _ in service.depends:
            if dep not in services:
                raise ComposeError(f"service {service.name} depends on unknown {dep}")
    return Compose(services, subnet, volumes)


def _service(path: Path, name: str, spec: Any, image: Image, dockerfile: Path,
             network: str, volumes: tuple[str, ...]) -> Service:
    where = f"service {name}"
    if not isinstance(spec, dict):
        raise ComposeError(f"{where}: not a mapping")
    unknown = sorted(k for k in spec if k not in SERVICE_KEYS)
    if unknown:
        raise ComposeError(f"{where}: keys not replayed: {unknown}")
    build = spec.get("build")
    if not isinstance(build, dict):
        raise ComposeError(f"{where}: needs a `build` naming the replayed Dockerfile")
    built = (path.parent / build.get("context", ".") / build.get("dockerfile", "Dockerfile"))
    if built.resolve() != dockerfile.resolve():
        raise ComposeError(f"{where}: builds {built}, not the replayed {dockerfile}")
    if spec.get("restart", "no") not in ("no", False):
        raise ComposeError(f"{where}: restart {spec['restart']!r} is not replayed")
    if "entrypoint" in spec:
        entrypoint = _argv(spec["entrypoint"], f"{where} entrypoint")
        command = _argv(spec["command"], f"{where} command") if "command" in spec else ()
    else:
        entrypoint = image.entrypoint
        command = (_argv(spec["command"], f"{where} command") if "command" in spec
                   else image.cmd)
    argv = (*entrypoint, *command)
    if not argv:
        raise ComposeError(f"{where}: no command to run")
    env = dict(image.env)
    environment = spec.get("environment") or {}
    if isinstance(environment, list):
        environment = dict(str(e).partition("=")[::2] for e in environment)
    for key, value in environment.items():
        env[str(key)] = _unescape("" if value is None else value, f"{where} environment")
    mounts = []
    for entry in spec.get("volumes") or []:
        if not isinstance(entry, str):
            raise ComposeError(f"{where}: long-form volume {entry!r} is not replayed")
        parts = _unescape(entry, f"{where} volumes").split(":")
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
            raise ComposeError(f"{where}: volume {entry!r} is not replayed")
        source, target = parts[0], parts[1]
        named = not source.startswith((".", "/", "~"))
        if named and source not in volumes:
            raise ComposeError(f"{where}: volume {source!r} is not declared")
        if not named:
            source = str((path.parent / os.path.expanduser(source)).resolve())
        mounts.append(Mount(source, target, named, len(parts) == 3 and parts[2] == "ro"))
    nets = spec.get("networks") or [network]
    address = None
    if isinstance(nets, dict):
        if list(nets) != [network]:
            raise ComposeError(f"{where}: networks {list(nets)} (expected only {network})")
        address = ((nets[network] or {}).get("ipv4_address"))
    elif nets != [network]:
        raise ComposeError(f"{where}: networks {nets} (expected only {network})")
    depends_spec = spec.get("depends_on") or []
    depends = []
    if isinstance(depends_spec, list):
        depends = [(str(d), "service_started") for d in depends_spec]
    else:
        for dep, cond in depends_spec.items():
            condition = (cond or {}).get("condition", "service_started")
            if condition not in ("service_started", "service_completed_successfully"):
                raise ComposeError(f"{where}: depends_on condition {condition!r} "
                                   "is not replayed")
            depends.append((str(dep), condition))
    return Service(name, argv, env, str(spec.get("user", image.user)),
                   str(spec.get("working_dir", image.workdir)), tuple(mounts),
                   None if address is None else str(address), tuple(depends))


def start_order(services: Mapping[str, Service]) -> list[str]:
    """Services in an order that starts every dependency first (refuses a cycle)."""
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in order:
            return
        if name in visiting:
            raise ComposeError(f"depends_on cycle through {name}")
        visiting.add(name)
        for dep, _ in services[name].depends:
            visit(dep)
        visiting.discard(name)
        order.append(name)

    for name in services:
        visit(name)
    return order


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str
    seconds: float
    exits: dict[str, int | None] = field(default_factory=dict)


@dataclass
class Topology:
    compose: Compose
    image: Image
    work: Path
    say: Callable[[str], None]
    _processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def run(self, target: str, timeout_s: float) -> Outcome:
        services = self.compose.services
        if target not in services:
            raise ComposeError(f"no service {target!r} (have {sorted(services)})")
        order = start_order(services)
        hosts = {name: f"c{i}" for i, name in enumerate(order)}
        fixed = {hosts[n]: s.address for n, s in services.items() if s.address}
        started = time.monotonic()
        mounts = Mounts()
        netns.sweep_stale()
        topology = NetnsTopology(list(hosts.values()), self.compose.subnet, addresses=fixed)
        try:
            topology.create()
            for name in order:
                self._wait_depends(services[name], started, timeout_s)
                root = self._container(name, mounts)
                self._start(name, root, topology.hosts[hosts[name]].argv)
                if name == target:
                    break
            code = self._wait(target, started + timeout_s)
            outcome = Outcome(code, self._read(target, "stdout"), self._read(target, "stderr"),
                              time.monotonic() - started)
            outcome.exits = self._stop_all()
            return outcome
        finally:
            self._stop_all()
            topology.destroy()
            mounts.unmount_all()

    def _wait_depends(self, service: Service, started: float, timeout_s: float) -> None:
        for dep, condition in service.depends:
            if condition != "service_completed_successfully":
                continue
            code = self._wait(dep, started + timeout_s)
            if code != 0:
                raise ComposeError(f"service {dep} exited {code} (service {service.name} "
                                   f"waits for it to complete): {self._read(dep, 'stderr')}")

    def _container(self, name: str, mounts: Mounts) -> Path:
        base = self.work / "containers" / name
        root = base / "root"
        mounts.overlay(self.image.layers, base / "upper", base / "work", root)
        mounts.system(root)
        service = self.compose.services[name]
        covered = {m.target for m in service.mounts}
        for index, volume in enumerate(self.image.volumes):
            if volume not in covered:  # an anonymous volume, filled from the image
                self._bind_volume(root, volume, base / f"volume-{index}", mounts)
        for mount in service.mounts:
            if mount.named:
                self._bind_volume(root, mount.target, self.work / "volumes" / mount.source,
                                  mounts, mount.read_only)
            else:
                mounts.bind(Path(mount.source), inside_root(root, mount.target), mount.read_only)
        return root

    @staticmethod
    def _bind_volume(root: Path, target: str, folder: Path, mounts: Mounts,
                     read_only: bool = False) -> None:
        inside = inside_root(root, target)
        if not folder.exists():
            if inside.is_dir():  # Docker fills a new volume from the image, owners too
                shutil.copytree(inside, folder, symlinks=True)
                _copy_owners(inside, folder)
            else:
                folder.mkdir(parents=True)
        mounts.bind(folder, inside, read_only)

    def _start(self, name: str, root: Path, in_netns: Callable[[list[str]], list[str]]
               ) -> None:
        service = self.compose.services[name]
        spec = {"root": str(root), "workdir": service.workdir, "user": service.user,
                "env": service.env, "argv": list(service.argv)}
        logs = self.work / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.say(f"start {name}: {shlex.join(service.argv)}")
        # the child holds its own copies of the log descriptors; ours close at once
        with open(logs / f"{name}.stdout", "wb") as out, \
                open(logs / f"{name}.stderr", "wb") as err:
            self._processes[name] = subprocess.Popen(
                in_netns(launcher(spec)), stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                start_new_session=True, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})

    def _read(self, name: str, stream: str) -> str:
        path = self.work / "logs" / f"{name}.{stream}"
        return path.read_text(errors="replace") if path.is_file() else ""

    def _wait(self, name: str, deadline: float) -> int:
        process = self._processes[name]
        while True:
            code = process.poll()
            if code is not None:
                return code
            if time.monotonic() > deadline:
                tail = " | ".join(self._read(name, "stderr").splitlines()[-8:])
                raise ComposeError(f"service {name} still running at the deadline: {tail}")
            for other, proc in self._processes.items():
                if other != name and proc.poll() not in (None, 0):
                    tail = " | ".join(self._read(other, "stderr").splitlines()[-8:])
                    raise ComposeError(f"service {other} exited {proc.poll()} while waiting "
                                       f"for {name}: {tail}")
            time.sleep(0.2)

    def _stop_all(self) -> dict[str, int | None]:
        exits: dict[str, int | None] = {}
        for proc in self._processes.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        for name, proc in self._processes.items():
            try:
                exits[name] = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                exits[name] = None
        return exits

    def written(self, name: str, path: str) -> list[str]:
        """What service `name`'s container wrote under `path` (absolute, inside the
        container) into its own layer, as paths relative to `path`; a volume mounted
        there is not looked at. Call before `remove`."""
        return written_under(self.work / "containers" / name / "upper", path)

    def remove(self) -> None:
        remove_tree(self.work / "containers")
        if (self.work / "volumes").exists():
            remove_tree(self.work / "volumes")


def _copy_owners(source: Path, target: Path) -> None:
    """Give every path under `target` the owner of its twin under `source`."""
    for dirpath, dirnames, filenames in os.walk(source):
        for name in [".", *dirnames, *filenames]:
            src = Path(dirpath) / name
            info = src.lstat()
            os.lchown(target / src.relative_to(source), info.st_uid, info.st_gid)


def written_under(upper: Path, path: str) -> list[str]:
    """Entries (files, links, directories, whiteouts) that an overlay's upper layer
    `upper` holds under `path` (absolute inside the root), relative to it, sorted."""
    top = inside_root(upper, path)
    if not top.is_dir():
        return []
    return sorted(str(entry.relative_to(top)) for entry in top.rglob("*"))
