"""A flood of QUIC Initials while a 3-stage run decodes (slow: real nodes, SmolLM2).

Three `swactor node` processes and the orchestrator (this process) on loopback. Run 1
warms up (weights, worker, links); run 2 is the quiet reference; during run 3, from its
first token on, an adversary sends 1,000 Initials (1200 bytes, fresh connection ids, no
token: a spoofer's view) to each node's QUIC port. Run 4 starts once the flood has
ended, so its stage reports count every Initial however fast run 3 decoded. The victim
must:

- complete run 3 (and run 4) with a clean teardown and the same greedy tokens as run 2;
- answer every Initial with a Retry smaller than it (no amplification) and build no
  connection for it: by run 4 each node's status shows at least 1,000 more Retries
  than after the quiet run, no half-open handshake, and exactly as many accepted
  handshakes in runs 3 and 4 as the quiet run took per run;
- keep no link of its own: once a session has ended and its links are gone (its
  CONNECTION_CLOSE read and their draining over), each node holds exactly the links it
  held at that moment after the quiet run (the edges between nodes, kept across runs).
  A stage report is no place to count links: it is printed while the orchestrator's
  session is ending, so that session's control and token edge links may be open,
  draining or gone there;
- keep its memory: resident set growth over run 3 is printed and bounded loosely.

The slowdown (decode tokens/s quiet over flooded, and the runs' wall times) is printed
as a measurement, not asserted (this machine is shared).
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

from swactor.cluster.launcher import LocalCluster
from swactor.events.emitter import configure
from swactor.model.paths import default_model_path
from swactor.orchestrator.session import SessionOptions, SessionReport, run_session
from swactor.transport.config import ALPNS
from swactor.wire import RunOutcome, TeardownOutcome

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TOKENS = 32
MAX_SEQ = 96
PROMPT = "Name three colours."
PER_NODE = 1000
BURST = 5  # Initials per node per burst, one burst every 20 ms (~4 s per 1,000)
SETTLE_S = 45.0
"""How long a node may take to forget an ended session's links: three probe timeouts
after its CONNECTION_CLOSE, or the 30 s idle timeout if that datagram was lost."""


class Flood:
    """Sends `PER_NODE` Initials to each target from one socket, counting the replies."""

    def __init__(self, targets: list[tuple[str, int]]) -> None:
        self.targets = targets
        self.sent = 0
        self.replies = 0
        self.reply_bytes_max = 0
        self.sent_at_end: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        config = QuicConfiguration(is_client=True, alpn_protocols=list(ALPNS))
        client = QuicConnection(configuration=config)
        client.connect(("127.0.0.1", 9), now=0.0)
        self.template = client.datagrams_to_send(now=0.0)[0][0]
        assert len(self.template) >= 1200

    def start(self) -> None:
        if not self.thread.is_alive() and self.sent == 0:
            self.thread.start()

    def _run(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        t = self.template
        try:
            for _ in range(PER_NODE // BURST):
                for target in self.targets:
                    for _ in range(BURST):
                        sock.sendto(t[:6] + os.urandom(8) + t[14:], target)
                        self.sent += 1
                self._drain(sock)
                time.sleep(0.02)
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                self._drain(sock)
                time.sleep(0.05)
        finally:
            sock.close()

    def _drain(self, sock: socket.socket) -> None:
        while True:
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                return
            self.replies += 1
            self.reply_bytes_max = max(self.reply_bytes_max, len(data))


class FirstToken(io.StringIO):
    """The session's token output: starts the flood on the first text it gets."""

    def __init__(self, flood: Flood) -> None:
        super().__init__()
        self.flood = flood

    def write(self, text: str) -> int:
        if text:
            self.flood.start()
        return super().write(text)


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def _transport(node: Any, run: int) -> dict[str, Any]:
    finished = [r for r in node.reports if r.get("kind") == "stage_finished"
                and r.get("run_id") == run]
    assert finished, node.reports
    transport = finished[-1]["transport"]
    assert isinstance(transport, dict)
    return transport


async def _statuses(cluster: LocalCluster) -> list[dict[str, Any]]:
    """Every node's leak check, asked now (SIGUSR1 -> a `status` line)."""
    marks = [len(node.reports) for node in cluster.nodes]
    for node in cluster.nodes:
        node.process.send_signal(signal.SIGUSR1)
    found: list[dict[str, Any]] = []
    async with asyncio.timeout(30):
        for node, mark in zip(cluster.nodes, marks, strict=True):
            while not (fresh := [r for r in node.reports[mark:] if r.get("kind") == "status"]):
                await asyncio.sleep(0.05)
            found.append(fresh[-1]["transport"])
    return found


async def _settled(cluster: LocalCluster) -> list[dict[str, Any]]:
    """Each node's transport status once the ended session has left no link there: none
    to the orchestrator is open and none is closing (`SETTLE_S`)."""
    orchestrator = f"{cluster.orchestrator.node_id:016x}"
    deadline = time.monotonic() + SETTLE_S
    while True:
        found = await _statuses(cluster)
        if all(orchestrator not in t["peers"] and not t["closing"] for t in found):
            return found
        assert time.monotonic() < deadline, f"links of an ended session stay: {found}"
        await asyncio.sleep(0.25)


async def scenario(tmp: Path) -> None:
    model = default_model_path()
    if not model.is_file():
        pytest.fail(f"{model} missing: run scripts/setup.sh")
    events = tmp / "events"
    cluster = LocalCluster(3, tmp / "keys", events)
    emitter = configure("orchestrator-test", str(events / "orchestrator.jsonl"), verbosity=None)
    try:
        members = await cluster.start()
        base = SessionOptions(identity=cluster.orchestrator, nodes=members, model=model,
                              admission=cluster.admission,  # pins the nodes' full keys
                              prompt=PROMPT, max_tokens=TOKENS, max_seq_len=MAX_SEQ)
        reports: dict[int, SessionReport] = {}
        walls: dict[int, float] = {}
        rss: dict[int, list[int]] = {}
        settled: dict[int, list[dict[str, Any]]] = {}
        flood = Flood([(m.host, m.port) for m in members])
        for run in (1, 2, 3, 4):
            if run == 4:
                await asyncio.to_thread(flood.thread.join, 30)
                assert not flood.thread.is_alive(), "the flood did not end"
            out: io.StringIO = FirstToken(flood) if run == 3 else io.StringIO()
            rss[run] = [_rss_kib(node.process.pid) for node in cluster.nodes]
            started = time.monotonic()
            reports[run] = await run_session(replace(base, run_id=run), emitter, out,
                                             io.StringIO())
            walls[run] = time.monotonic() - started
            if run == 3:
                flood.sent_at_end = flood.sent
            await cluster.wait_reports(run, timeout_s=60)
            if run in (2, 4):
                settled[run] = await _settled(cluster)
        after = rss[4]  # after run 3 and the whole flood, before run 4

        quiet, flooded = reports[2], reports[3]
        for report in (quiet, flooded, reports[4]):
            assert report.result.outcome is RunOutcome.Completed, report.summary_lines()
            assert report.result.teardown is TeardownOutcome.Clean, report.summary_lines()
        assert flooded.result.generated_token_ids == quiet.result.generated_token_ids
        assert reports[4].result.generated_token_ids == quiet.result.generated_token_ids

        assert flood.sent == PER_NODE * len(members)
        assert flood.sent_at_end, "the flood did not overlap the decoding run"
        assert flood.replies > 0 and flood.reply_bytes_max < len(flood.template)
        for node, quiet_after, flooded_after in zip(cluster.nodes, settled[2], settled[4],
                                                     strict=True):
            t1, t2, t3, t4 = (_transport(node, run) for run in (1, 2, 3, 4))
            retries = t4["admission"].get("retry_sent", 0) - t2["admission"].get("retry_sent", 0)
            assert retries >= PER_NODE, (t2, t4)
            for t in (t3, t4):
                assert t["half_open"] == 0, t
            accepted = [t["admission"].get("accepted", 0) for t in (t1, t2, t4)]
            assert accepted[2] - accepted[1] == 2 * (accepted[1] - accepted[0]), (t1, t2, t4)
            for key in ("links", "half_open", "peers"):
                assert flooded_after[key] == quiet_after[key], (quiet_after, flooded_after)
        growth = [a - b for a, b in zip(after, rss[3], strict=True)]
        print(f"\n[flood] {flood.sent} Initials ({flood.sent_at_end} before the run ended), "
              f"{flood.replies} Retries back (largest {flood.reply_bytes_max} bytes vs "
              f"{len(flood.template)} sent)")
        q, f = quiet.timings, flooded.timings
        print(f"[flood] decode tokens/s quiet {q['tokens_per_s']:.2f}, flooded "
              f"{f['tokens_per_s']:.2f} (ratio {q['tokens_per_s'] / f['tokens_per_s']:.2f}); "
              f"wall quiet {walls[2]:.2f} s, flooded {walls[3]:.2f} s")
        print(f"[flood] node RSS growth over the flooded run (KiB): {growth}")
        assert max(growth) < 64 * 1024, growth
    finally:
        codes = await cluster.stop()
        emitter.close()
    assert codes == [0, 0, 0]


def test_a_flood_of_initials_during_a_3_stage_run(tmp_path: Path) -> None:
    asyncio.run(scenario(tmp_path))
