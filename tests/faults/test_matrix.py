"""Fault matrix (spec §36, §38, §39): one fault per case on one shared 3-node cluster.

Each case arms one `swactor.faults` entry (or changes the session's inputs), runs a
session, and checks what every run-level fault must leave (see `rig.FaultRig`): one
terminal outcome with the first reason and the component that saw it, `run_torn_down`
with a teardown outcome, no ring lease on any node (the orchestrator's token arena
included), no orphan process, and a clean next run on the same nodes. Cases run in file
order on the same nodes, so each also proves that the previous one left the cluster
serviceable. Each case expects exactly its own reason: a peer's StreamFault that races
the faulting stage's report is not accepted in its place (the Settling state of
`fsm/orchestrator_run.yaml` records the root cause).

The rows are collected; with `SWACTOR_FAULTS_JSON=PATH` they are written there as JSON
(`swactor.faults.table` turns them into the README's "Fault behaviour" table).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

from swactor.membership.admission import Admission, PoolEntry, public_key_bytes
from swactor.orchestrator.session import PoolMember
from swactor.transport.identity import NodeIdentity
from swactor.wire import NodeId
from tests.faults.rig import WARM_UP, FaultRig, FaultRow, Observed, reference_tokens

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROWS: list[FaultRow] = []


@dataclass(frozen=True)
class Case:
    source: str
    injected: str
    outcome: str
    reasons: frozenset[str]
    entries: list[dict[str, Any]] = field(default_factory=list)
    stage: int = 1
    """The stage whose node the entries target (`node` is filled in)."""


def _reasons(*names: str) -> frozenset[str]:
    return frozenset(names)


CASES: list[Any] = [
    Case("provisioning rejected", "node.provision_reject on stage 1's node", "Faulted",
         _reasons("ProvisioningRejected"), [{"point": "node.provision_reject"}]),
    Case("oversized ring request", "node.ring_oversize: stage 1 asks for more than its arena",
         "Faulted", _reasons("RingRequestOversized"), [{"point": "node.ring_oversize"}]),
    Case("weight file 404", "node.weights_path -> a path that does not exist", "Faulted",
         _reasons("WeightDownloadFailed"),
         [{"point": "node.weights_path", "path": "{missing}"}]),
    Case("weight file truncated", "node.weights_path -> the GGUF cut to half its bytes",
         "Faulted", _reasons("WeightLoadFailed"),
         [{"point": "node.weights_path", "path": "{truncated}"}]),
    Case("weight file corrupt", "node.weights_path -> the GGUF with a garbled header",
         "Faulted", _reasons("WeightLoadFailed"),
         [{"point": "node.weights_path", "path": "{corrupt}"}]),
    Case("edge establishment failure",
         "driver.connect: stage 0's send pump fails its QUIC handshake", "Faulted",
         _reasons("EdgeEstablishmentFailed"),
         [{"point": "driver.connect"}], stage=0),
    Case("malformed object header", "worker.egress_header garble: stage 0's object 1",
         "Faulted", _reasons("ObjectHeaderMalformed"),
         [{"point": "worker.egress_header", "sequence": 1, "mode": "garble"}], stage=0),
    Case("sequence violation", "worker.egress_header: stage 0's object 1 says sequence 6",
         "Faulted", _reasons("SequenceViolation"),
         [{"point": "worker.egress_header", "sequence": 1, "mode": "sequence"}], stage=0),
    Case("EOF mid-object", "driver.send fin: stage 0's send pump ends its stream mid-object",
         "Faulted", _reasons("EofMidObject"),
         [{"point": "driver.send", "after_bytes": 1, "mode": "fin"}], stage=0),
    Case("EOF mid-object on token-out",
         "driver.send fin: the last stage's send pump ends the token-out stream mid-object",
         "Faulted", _reasons("EofMidObject"),
         [{"point": "driver.send", "after_bytes": 1, "mode": "fin"}], stage=2),
    Case("stream fault (peer reset)", "driver.send reset: stage 0 resets its edge stream",
         "Faulted", _reasons("StreamFault"),
         [{"point": "driver.send", "after_bytes": 1, "mode": "reset"}], stage=0),
    Case("device out of memory", "worker.alloc_cap 64 bytes on stage 1's worker", "Faulted",
         _reasons("DeviceOutOfMemory"), [{"point": "worker.alloc_cap", "bytes": 64}]),
    Case("step failure", "worker.step raise: the role raises at step 1 on stage 1", "Faulted",
         _reasons("StepFailed"), [{"point": "worker.step", "sequence": 1, "mode": "raise"}]),
    Case("arena pressure timeout", "arena.pressure: no lease fits on stage 1's node (queued), "
         "lease timer 2 s", "Faulted", _reasons("ArenaPressureTimeout"),
         [{"point": "arena.pressure", "lease_timeout_s": 2.0}]),
    Case("pump failure", "driver.pump: stage 0's send pump fails (its ring read raises)",
         "Faulted", _reasons("PumpFailed"), [{"point": "driver.pump"}], stage=0),
    Case("ring fault", "worker.ring_fault: stage 1's worker faults its ingress ring",
         "Faulted", _reasons("RingFault"),
         [{"point": "worker.ring_fault", "direction": "ingress"}]),
    Case("device copy failure", "worker.copy: stage 1's host-to-device copy fails", "Faulted",
         _reasons("DeviceCopyFailed"),
         [{"point": "worker.copy", "direction": "host_to_device"}]),
    # the two worker deaths: the next run on that node waits for the restarted worker
    # (GpuWorkerCtl holds its commands until WorkerReady, spec §31, §39 "worker restart")
    Case("worker fatal error", "worker.fatal: stage 1's worker raises on GrantSteps",
         "Faulted", _reasons("WorkerFatal"),
         [{"point": "worker.fatal", "command": "GrantSteps"}]),
    Case("worker crash (kill -9 mid-step)", "worker.step kill: SIGKILL at step 1 on stage 1",
         "Faulted", _reasons("WorkerCrashed"),
         [{"point": "worker.step", "sequence": 1, "mode": "kill"}]),
]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultRig]:
    rig = FaultRig(tmp_path_factory.mktemp("faults"))
    try:
        rig.start()
        ok, detail = rig.clean_run(WARM_UP)  # also compiles the kernels once
        assert ok, detail
        yield rig
    finally:
        codes = rig.close()
        out = os.environ.get("SWACTOR_FAULTS_JSON")
        if out:
            Path(out).write_text(json.dumps([asdict(r) for r in ROWS], indent=1))
    assert codes == [0, 0, 0], codes


def _weights(rig: FaultRig) -> dict[str, str]:
    data = rig.gguf.read_bytes()
    truncated = rig.tmp / "truncated.gguf"
    truncated.write_bytes(data[: len(data) // 2])
    corrupt = rig.tmp / "corrupt.gguf"
    corrupt.write_bytes(b"\x00GGX" + bytes(reversed(data[4:64])) + data[64:])
    return {"{missing}": str(rig.tmp / "missing" / "tiny.gguf"),
            "{truncated}": str(truncated), "{corrupt}": str(corrupt)}


def _stage_nodes(rig: FaultRig) -> list[int]:
    """Planner order: stage i runs on the i-th pool member."""
    return [int(m.node_id) for m in rig.members]


def check(row: FaultRow, seen: Observed, outcome: str, reasons: frozenset[str]) -> None:
    assert row.outcome == outcome, (row, seen.names())
    assert row.reason in reasons, (row, seen.names())
    if seen.report is not None:
        assert len([n for n in seen.names() if n in ("run_completed", "run_faulted")]) <= 1
        assert row.torn_down, seen.names()
        assert row.teardown in ("Clean", "Faulted", "TimedOut")
    assert row.leases_left == 0, row
    assert not row.notes or not row.notes[0].startswith("active run"), row
    assert row.orphans == 0, row
    assert not seen.trace, seen.trace  # every process's events: an order the tables allow
    assert row.next_run_ok, row.notes


@pytest.mark.parametrize("case", CASES,
                         ids=[c.source if isinstance(c, Case) else None for c in CASES])
def test_fault(rig: FaultRig, case: Case) -> None:
    if ROWS and not ROWS[-1].next_run_ok:  # the previous case's row already says so
        for _ in range(2):
            if rig.clean_run()[0]:
                break
    node = _stage_nodes(rig)[case.stage]
    paths = _weights(rig)
    entries = [{**{k: paths.get(v, v) if isinstance(v, str) else v for k, v in e.items()},
                "node": node} for e in case.entries]
    seen = rig.session(rig.options(), *entries)
    if seen.report is not None and seen.report.result.outcome is not None:
        faults = seen.faults()
        if seen.report.result.fault is not None:  # the first fault event is the recorded one
            assert faults and faults[0].reason is seen.report.result.fault.reason
    row = rig.row(case.source, case.injected, seen)
    ROWS.append(row)
    check(row, seen, case.outcome, case.reasons)


def test_node_unavailable_before_the_run(rig: FaultRig) -> None:
    """A pool member that is not running: the session stops before planning."""
    key = NodeIdentity.generate()  # pinned in the pool file, but no process has it
    ghost = PoolMember(NodeId(key.node_id), "127.0.0.1", 9)
    assert rig.cluster.admission is not None
    pool = Admission.of((*rig.cluster.admission.entries,
                         PoolEntry("node", public_key_bytes(key), "ghost")))
    seen = rig.session(rig.options(nodes=(*rig.members[:2], ghost), admission=pool))
    row = rig.row("node unavailable before the run", "a pool member with no process", seen)
    ROWS.append(row)
    assert seen.report is None and seen.error is not None and "pool" in seen.error
    assert "run_planned" not in seen.names() and not seen.trace
    assert row.leases_left == 0 and row.orphans == 0 and row.next_run_ok, row


def test_operator_stop_mid_decode(rig: FaultRig) -> None:
    """SIGINT to the orchestrator after two tokens: OperatorStopped, clean teardown, the
    tokens so far in the result (spec §36, §38)."""
    slow = {"point": "worker.step", "mode": "delay", "delay_s": 0.4,
            "node": _stage_nodes(rig)[1]}
    seen = rig.session(rig.options(max_tokens=16), slow, during=rig.interrupt_after_tokens(2))
    row = rig.row("operator stop (SIGINT) mid-decode", "SIGINT after 2 token_received", seen)
    ROWS.append(row)
    assert seen.report is not None
    result = seen.report.result
    assert row.outcome == "OperatorStopped", (row, seen.names())
    assert row.teardown == "Clean", row
    assert 2 <= len(result.generated_token_ids) < 16
    longer = reference_tokens(rig.gguf, 16)
    assert result.generated_token_ids == longer[:len(result.generated_token_ids)]
    assert "run_faulted" not in seen.names() and row.torn_down and not seen.trace
    assert row.leases_left == 0 and row.orphans == 0 and row.next_run_ok, row
