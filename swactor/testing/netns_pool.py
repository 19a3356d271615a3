"""A SWIM-joined pool of `swactor node` processes on network-namespace test hosts, and a
serving pipeline over it (`ServingPool`), for the multi-host tests and `bench recovery`.

Pool. Stage host `n0` is the SWIM seed: the other nodes and every orchestrator join
through it, so no process is ever told another's QUIC address. Every process is given
the same pool file (`keys/pool.txt`, the pinned public keys of the orchestrator and the
stage hosts), as an operator would copy it to each machine. Each node trusts the
orchestrator key in `keys/orchestrator.key` and writes its events to
`events/<host>.jsonl`. Each node's model cache is an empty folder of its own
(`models/<host>`) and the orchestrator offers its model (`swactor orchestrator`'s
default: no `--offer-model` flag is given), so a node's weights arrive only as the byte
ranges it fetches from the orchestrator over QUIC, once per node.

Serving. `ServingPool` is an orchestrator host `orch` and the given stage hosts on one
bridge (`NetnsTopology`, a /24 picked from this process's id), a node on each stage
host and, once `serve()` is called, `swactor orchestrator --serve` on `orch` over the
whole pool, its events in `events/orchestrator.jsonl`. `NetnsStreams` streams greedy
completions from a process inside `orch`'s namespace (the only place that reaches the
server; `python -m tests.serve.streams`, run from the checkout), timing each chunk on
arrival. Leaving the `with` block stops the server and every node with SIGTERM and
records what `stopped` says (exit statuses, processes left in each namespace) before
the namespaces are removed, so a caller can tell a clean exit from a leftover.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from swactor.cluster import netns
from swactor.cluster.netns import Host, NetnsTopology
from swactor.membership.admission import add_member
from swactor.testing.host_process import ROOT, HostProcess
from swactor.testing.serve_process import ServeProcess
from swactor.transport.identity import NodeIdentity

STAGES = ("n0", "n1", "n2")
SWIM_PORT = 7946
BOOT_S = 300.0
HTTP_PORT = 8000


def seed(hosts: NetnsTopology) -> str:
    return f"{hosts[STAGES[0]].address}:{SWIM_PORT}"


def pool_file(keys: Path, stages: tuple[str, ...] = STAGES) -> Path:
    """`keys/pool.txt`, pinning the orchestrator's and every stage host's key (written once;
    the keys are made on first use, as `swactor pool add` would)."""
    path = keys / "pool.txt"
    if not path.exists():
        add_member(path, NodeIdentity.load_or_create(keys / "orchestrator.key"),
                   "orchestrator", "orch")
        for name in stages:
            add_member(path, NodeIdentity.load_or_create(keys / f"{name}.key"), "node", name)
    return path


def start_node(hosts: NetnsTopology, name: str, keys: Path, events: Path,
               orchestrator: int, stages: tuple[str, ...] = STAGES) -> HostProcess:
    """Stage host `name`'s node; `stages`: every stage host of the pool (the pool file)."""
    host = hosts[name]
    args = ["node", "--key", str(keys / f"{name}.key"), "--bind", host.address,
            "--swim", f"{host.address}:{SWIM_PORT}", "--pool", str(pool_file(keys, stages)),
            "--trust-orchestrator", str(orchestrator), "--arena-ceiling", "256MiB",
            "--event-verbosity", "-1", "--events-file", str(events / f"{name}.jsonl"),
            "--models-dir", str(models_dir(events, name))]
    if name != STAGES[0]:
        args += ["--seed", seed(hosts)]
    return HostProcess(name, hosts[name], args)


def models_dir(events: Path, name: str) -> Path:
    """Host `name`'s own model cache, empty before its node starts."""
    path = events.parent / "models" / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def wait_available(nodes: list[HostProcess]) -> dict[int, str]:
    """{node id: address} once every node printed `available` on its own address."""
    addresses = {}
    for node in nodes:
        available = node.wait_for(lambda d: d.get("kind") == "available", BOOT_S)
        assert available["quic"][0] == node.host.address, available
        addresses[int(available["node_id"])] = node.host.address
    return addresses


def events(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of an event file written so far (none before it exists)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class Stopped:
    """How a `ServingPool` ended, read before its namespaces were removed."""

    serve: int | None = None
    """The server's exit status (None: it was never started)."""
    serve_error: str = ""
    """Why the server did not stop by itself after SIGTERM (it was killed), else empty."""
    nodes: dict[str, int | None] = field(default_factory=dict)
    """Each node's exit status after SIGTERM (None: still running after the wait)."""
    left: dict[str, list[int]] = field(default_factory=dict)
    """The processes still in each host's namespace."""


class ServingPool:
    """Nodes on `hosts` and `swactor orchestrator --serve` on `orch` (module doc)."""

    def __init__(self, root: Path, hosts: tuple[str, ...], *, subnet_base: int) -> None:
        """`root`: a fresh folder for keys/ and events/; `subnet_base`: the second octet
        of the test subnet is `subnet_base + pid % 50` (callers that may run at once
        pick different bases)."""
        self.names = hosts
        self.keys, self.events_dir = root / "keys", root / "events"
        self.log = self.events_dir / "orchestrator.jsonl"
        pid = os.getpid()
        self.topology = NetnsTopology(["orch", *hosts], ipaddress.IPv4Network(
            f"10.{subnet_base + pid % 50}.{(pid + 2) % 250}.0/24"))
        self.nodes: dict[str, HostProcess] = {}
        self.serving: ServeProcess | None = None
        self.stopped = Stopped()

    @property
    def orch(self) -> Host:
        return self.topology["orch"]

    def __enter__(self) -> ServingPool:
        netns.sweep_stale()
        self.keys.mkdir(mode=0o700, parents=True)
        self.events_dir.mkdir()
        orchestrator = NodeIdentity.load_or_create(self.keys / "orchestrator.key").node_id
        self.topology.__enter__()
        try:
            self.nodes = {name: start_node(self.topology, name, self.keys, self.events_dir,
                                           orchestrator, self.names) for name in self.names}
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def serve(self, args: Sequence[str], boot_s: float) -> str:
        """Once every node is available, `swactor orchestrator --serve` over the pool with
        `args` added (split, spares, ...); its URL once it serves (AssertionError naming
        why not, the server's stderr included)."""
        wait_available(list(self.nodes.values()))
        orch = self.orch
        self.serving = ServeProcess([
            "orchestrator", "--key", str(self.keys / "orchestrator.key"),
            "--bind", orch.address, "--seed", seed(self.topology),
            "--nodes", str(len(self.names)), "--pool", str(pool_file(self.keys, self.names)),
            "--serve", f"{orch.address}:{HTTP_PORT}", "--event-verbosity", "-1",
            "--events-file", str(self.log), *args], prefix=orch.argv([]))
        return self.serving.wait_url(boot_s)

    def stage_hosts(self, run_id: int) -> dict[int, str]:
        """{stage index: host name} of run `run_id`, from the nodes' event files."""
        found: dict[int, str] = {}
        for name in self.names:
            for event in events(self.events_dir / f"{name}.jsonl"):
                if event.get("run_id") == run_id and event.get("stage_index") is not None:
                    found[int(event["stage_index"])] = name
        return found

    def describe(self) -> str:
        return "\n".join([self.serving.describe() if self.serving is not None else "no server",
                          *(node.describe() for node in self.nodes.values())])

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        try:
            if self.serving is not None:
                try:
                    self.stopped.serve = self.serving.stop()
                except AssertionError as why:  # killed after the wait
                    self.stopped.serve_error = str(why)
            self.stopped.nodes = {name: node.stop(30) for name, node in self.nodes.items()}
            self.stopped.left = {name: self.topology.pids(name)
                                 for name in self.topology.hosts}
        finally:
            self.topology.__exit__(kind, error, trace)


class NetnsStreams:
    """Greedy streams of `prompts` from `python -m tests.serve.streams` inside `host`'s
    namespace: each stream's chunk arrival times (monotonic, here) as they come, and
    its results (prompt, chunks, finish, error) once the process ends."""

    def __init__(self, host: Host, url: str, max_tokens: int, prompts: Sequence[str]) -> None:
        self.process = subprocess.Popen(
            host.argv([sys.executable, "-m", "tests.serve.streams", url, str(max_tokens),
                       *prompts]),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        self.times: list[list[float]] = [[] for _ in prompts]
        self.results: list[dict[str, Any]] | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            now = time.monotonic()
            document = json.loads(line)
            if "results" in document:
                self.results = document["results"]
            else:  # one line may stand for chunks that arrived together
                times = self.times[document["stream"]]
                times += [now] * (document["chunks"] - len(times))

    @property
    def chunks(self) -> list[int]:
        """Each stream's chunks so far."""
        return [len(times) for times in self.times]

    def wait_chunks(self, count: int, timeout_s: float) -> list[int]:
        """Until every stream has `count` chunks; the counts then."""
        deadline = time.monotonic() + timeout_s
        while min(self.chunks) < count:
            assert self.process.poll() is None, self.describe()
            assert time.monotonic() < deadline, f"the streams did not start: {self.chunks}"
            time.sleep(0.01)
        return self.chunks

    def finish(self, timeout_s: float) -> list[dict[str, Any]]:
        """Each stream's results once the client exited 0 (streams that failed included:
        their `error` says why)."""
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"the streams hung at {self.chunks} chunks") from None
        self._reader.join(10)
        assert self.process.returncode == 0 and self.results is not None, self.describe()
        return self.results

    def describe(self) -> str:
        assert self.process.stderr is not None
        if self.process.poll() is None:
            return "the stream client is still running"
        return (f"the stream client exited {self.process.returncode}: "
                f"{self.process.stderr.read()[-2000:]}")
