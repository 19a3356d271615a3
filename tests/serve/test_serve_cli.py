"""`swactor serve` / `swactor orchestrator --serve`: help, bad flags (refused before any node
starts, exit 2 with one line naming the problem), and the live-node view that re-plans."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swactor.cli import build_parser
from swactor.fsm.generated import orchestrator_run as orun
from swactor.membership import BootHealth, MemberChanged, MemberMeta, MemberState
from swactor.orchestrator.session import PoolMember
from swactor.serve.serve_cmd import (
    LiveNodes,
    http_address,
    local_stage_threads,
    objects_in_flight_for,
    warm_batch_rows,
    warm_mixed_rows,
)
from swactor.testing.serve_process import ServeProcess, cmdline, descendants
from swactor.wire import NodeId


def swactor(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "swactor.cli", *argv], capture_output=True,
                          text=True, timeout=60, check=False)


def test_serve_help_explains_the_api_and_the_stop() -> None:
    done = swactor("serve", "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    for words in ("/v1/chat/completions", "stream=true", "Ctrl-C", "--slots K",
                  "--max-restarts N", "curl http://127.0.0.1:8000"):
        assert words in text


@pytest.mark.parametrize(("argv", "batch", "warm"), [
    ([], 4, 4),                                    # 4-row batches, 2..4-row kernels built
    (["--batch-rows", "1"], 1, 0),                 # one row per object: nothing to build
    (["--batch-rows", "2"], 2, 2),                 # batches of 2, 2-row kernels built
    (["--batch-rows", "8", "--slots", "8"], 8, 4),  # batches of 8, kernels up to 4 rows
    (["--batch-rows", "4", "--slots", "1"], 4, 0),  # one slot: no batch to build for
    (["--batch-rows", "3", "--warm-batch-rows", "3"], 3, 3),
    (["--batch-rows", "4", "--warm-batch-rows", "8"], 4, 4),  # never more than the slots
    (["--batch-rows", "4", "--warm-batch-rows", "0"], 4, 0),  # only the kernel cache's
    (["--batch-rows", "1", "--warm-batch-rows", "2"], 1, 2),
])
def test_serve_batches_four_rows_per_object_unless_asked_otherwise(
        argv: list[str], batch: int, warm: int) -> None:
    for command in (["serve"], ["orchestrator", "--key", "k", "--serve", "127.0.0.1:0"]):
        args = build_parser(command[0]).parse_args([*command, *argv])
        assert (args.batch_rows, warm_batch_rows(args)) == (batch, warm)


@pytest.mark.parametrize(("argv", "mixed"), [
    ([], 0),                                            # mixed steps off: nothing built
    (["--mixed-steps", "on"], 3),                       # 4 slots: 1-3 rows beside a prompt
    (["--mixed-steps", "on", "--slots", "8"], 4),       # at most a batch's 4 rows
    (["--mixed-steps", "on", "--batch-rows", "2"], 2),
    (["--mixed-steps", "on", "--slots", "1"], 0),       # one slot: no row beside a prompt
    (["--mixed-steps", "off", "--slots", "8"], 0),
])
def test_serve_warms_mixed_step_graphs_only_with_mixed_steps_on(
        argv: list[str], mixed: int) -> None:
    for command in (["serve"], ["orchestrator", "--key", "k", "--serve", "127.0.0.1:0"]):
        args = build_parser(command[0]).parse_args([*command, *argv])
        assert warm_mixed_rows(args) == mixed


@pytest.mark.parametrize(("stages", "batch_rows", "asked", "cpus", "cap"), [
    (3, 2, None, 2, 1),      # fewer CPUs than stages: one object, every CPU in turn
    (2, 2, None, 2, 2),      # local nodes on 2 CPUs: no more objects than CPUs
    (1, 2, None, 2, 2),      # one stage: the stage and the orchestrator's hop
    (3, 2, None, 16, 4),     # enough CPUs: the stages plus one
    (3, 2, None, None, None),  # a pool's own hosts: the run's default (stages + 1)
    (3, 1, None, 2, None),   # one row per object: every sequence's step in flight
    (3, 2, 3, 2, 3),         # --objects-in-flight says
])
def test_objects_in_flight_are_bounded_by_the_cpus_local_stages_share(
        stages: int, batch_rows: int, asked: int | None, cpus: int | None,
        cap: int | None) -> None:
    assert objects_in_flight_for(stages, batch_rows, asked, cpus) == cap


@pytest.mark.parametrize(("stages", "batch_rows", "asked", "cpus", "threads"), [
    (1, 2, None, 2, 2),    # one stage computes at a time: every CPU
    (3, 2, None, 2, 2),    # fewer CPUs than stages: one object in flight, every CPU
    (2, 2, None, 2, 1),    # 2 objects in flight on 2 CPUs: two stages at once, 1 each
    (3, 2, 1, 2, 2),       # one object in flight: one stage at a time
    (3, 1, None, 16, 5),   # one row per object: every stage at once
    (3, 2, None, 16, 5),   # 4 in flight, at most the 3 stages compute
])
def test_local_nodes_split_the_cpus_among_stages_computing_at_once(
        stages: int, batch_rows: int, asked: int | None, cpus: int, threads: int) -> None:
    assert local_stage_threads(stages, batch_rows, asked, cpus) == threads


def test_objects_in_flight_default_to_the_runs_own_cap() -> None:
    for command in (["serve"], ["orchestrator", "--key", "k", "--serve", "127.0.0.1:0"]):
        parser = build_parser(command[0])
        assert parser.parse_args(command).objects_in_flight is None  # stages + 1
        assert parser.parse_args([*command, "--objects-in-flight", "2"]).objects_in_flight == 2


def test_orchestrator_help_offers_serve() -> None:
    done = swactor("orchestrator", "--help")
    assert done.returncode == 0 and "--serve HOST:PORT" in done.stdout


@pytest.mark.parametrize(("argv", "words"), [
    (["--nodes", "0"], "--nodes: 0 must be at least 1"),
    (["--port", "70000"], "70000 is not a port number"),
    (["--slots", "x"], "'x' is not an integer"),
    (["--slots", "65"], "65 is more than 64 slots per stage"),
    (["--nodes", "3", "--split", "15,15"], "--split names 2 stages but --nodes is 3"),
    (["--nodes", "2", "--stages", "3"], "--stages 3 needs at least as many --nodes, got 2"),
    (["--nodes", "4", "--stages", "3", "--split", "15,15"],
     "--split names 2 stages but --stages is 3"),
    (["--nodes", "4", "--stages", "3", "--spares", "2"],
     "--stages 3 and --spares 2 need 5 --nodes, got 4"),
    (["--nodes", "2", "--spares", "2"], "--spares 2 leaves no node of the 2"),
    (["--spares", "-1"], "--spares: -1 must be at least 0"),
    (["--max-queue", "-1"], "--max-queue: -1 must be at least 0"),
    (["--objects-in-flight", "0"], "--objects-in-flight: 0 must be at least 1"),
    (["--retry-delay", "nan"], "must be a finite number >= 0"),
    (["--model", "/nonexistent/model.gguf", "--port", "0"], "not found"),
])
def test_serve_refuses_bad_flags_with_exit_2(argv: list[str], words: str) -> None:
    done = swactor("serve", *argv)
    assert done.returncode == 2, done.stderr
    assert words in done.stderr
    assert "Traceback" not in done.stderr


def test_serve_device_reaches_the_local_nodes_workers() -> None:
    """`--device` is each local node's `--device`: a device tinygrad has no backend for
    fails the node's boot, and serve's error quotes the worker's own reason (the default
    device would have served)."""
    done = swactor("serve", "--port", "0", "--device", "nosuchdev", "--warm-prompt-tokens",
                   "0", "--warm-batch-rows", "0")
    assert done.returncode == 2, done.stderr
    assert "node 0 did not boot" in done.stderr
    assert "ops_nosuchdev" in done.stderr  # the worker tried to open NOSUCHDEV
    assert "Traceback" not in done.stderr


def test_serve_refuses_a_port_in_use_before_starting_nodes() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = swactor("serve", "--port", str(port))
    assert done.returncode == 2
    assert f"127.0.0.1:{port} is already in use" in done.stderr
    assert "starting" not in done.stderr  # no node was started


def test_orchestrator_serve_refuses_prompt_flags(tmp_path: Path) -> None:
    done = swactor("orchestrator", "--key", str(tmp_path / "o.key"), "--open-pool",
                   "--node", "1@127.0.0.1:7400", "--serve", "127.0.0.1:0", "--prompt", "hi")
    assert done.returncode == 2
    assert "--prompt shapes one prompt; with --serve each request brings its own" in done.stderr


def test_orchestrator_serve_refuses_spares_that_leave_no_stage(tmp_path: Path) -> None:
    done = swactor("orchestrator", "--key", str(tmp_path / "o.key"), "--open-pool",
                   "--node", "1@127.0.0.1:7400", "--serve", "127.0.0.1:0", "--spares", "1")
    assert done.returncode == 2
    assert "--spares 1 leaves no node of the 1 for the run's stages" in done.stderr


def test_orchestrator_serve_refuses_a_bad_address() -> None:
    done = swactor("orchestrator", "--key", "k", "--serve", "nowhere")
    assert done.returncode == 2 and "'nowhere' is not HOST:PORT" in done.stderr


def test_http_address_reads_ipv4_ipv6_and_names() -> None:
    assert http_address("127.0.0.1:8000") == ("127.0.0.1", 8000)
    assert http_address("[::1]:0") == ("::1", 0)
    assert http_address("localhost:80") == ("localhost", 80)


def _change(node: int, state: MemberState, *, health: BootHealth = BootHealth.Available,
            port: int = 7400, meta: bool = True) -> MemberChanged:
    return MemberChanged(NodeId(node), state, 1,
                         MemberMeta(swim_host="127.0.0.1", swim_port=7946, quic_host="127.0.0.1",
                                    quic_port=port, boot_health=health,
                                    role="node") if meta else None, 0.0)


def test_live_nodes_follow_swim_changes_for_the_next_plan() -> None:
    members = tuple(PoolMember(NodeId(n), "127.0.0.1", 7400 + n) for n in (3, 1, 2))
    live = LiveNodes(members, admitted=frozenset({NodeId(1), NodeId(2), NodeId(3)}), count=3)
    assert [int(m.node_id) for m in live.members()] == [1, 2, 3]  # node-id (stage) order
    live.observe(_change(2, MemberState.Suspect, meta=False))
    assert len(live.members()) == 3  # a suspicion is not a loss
    live.observe(_change(2, MemberState.Dead))
    assert [int(m.node_id) for m in live.members()] == [1, 3]
    live.observe(_change(3, MemberState.Alive, health=BootHealth.Unavailable))
    assert [int(m.node_id) for m in live.members()] == [1]
    live.observe(_change(9, MemberState.Alive))  # not pinned by the pool file
    assert [int(m.node_id) for m in live.members()] == [1]
    live.observe(_change(2, MemberState.Alive, port=7502))  # back, at a new port
    assert [(int(m.node_id), m.port) for m in live.members()] == [(1, 7401), (2, 7502)]


def test_live_nodes_tell_each_node_that_joins_the_usable_set_once() -> None:
    members = tuple(PoolMember(NodeId(n), "127.0.0.1", 7400 + n) for n in (1, 2))
    live = LiveNodes(members, count=1)
    joined: list[int] = []
    live.on_join = lambda node: joined.append(int(node))
    live.observe(_change(2, MemberState.Alive))  # already usable: no join
    live.observe(_change(3, MemberState.Alive))
    live.observe(_change(3, MemberState.Alive, port=7503))  # a new address, not a join
    live.observe(_change(2, MemberState.Dead))
    live.observe(_change(2, MemberState.Alive))  # back
    assert joined == [3, 2]


def test_live_nodes_skip_dead_processes_and_keep_at_most_count() -> None:
    members = tuple(PoolMember(NodeId(n), "127.0.0.1", 7400 + n) for n in (1, 2, 3))
    gone = {NodeId(1)}
    live = LiveNodes(members, count=2, alive=lambda node: node not in gone)
    assert [int(m.node_id) for m in live.members()] == [2, 3]
    gone.clear()
    assert [int(m.node_id) for m in live.members()] == [1, 2]


def test_live_nodes_place_survivors_at_their_stage_and_a_warm_spare_in_the_gap() -> None:
    members = tuple(PoolMember(NodeId(n), "127.0.0.1", 7400 + n) for n in (1, 2, 3, 4, 5))
    gone: set[NodeId] = set()
    live = LiveNodes(members, count=3, alive=lambda node: node not in gone)
    first, _ = live.place({})
    assert [int(m.node_id) for m in first] == [1, 2, 3]
    live.previous = tuple(m.node_id for m in first)
    assert [int(m.node_id) for m in live.idle(frozenset(live.previous))] == [4, 5]
    gone.add(NodeId(2))
    nodes, words = live.place({NodeId(5): frozenset({(1, 3)})})
    assert [int(m.node_id) for m in nodes] == [1, 5, 3]  # not [1, 3, 4]: nobody moves
    assert words == ["stage 1 on spare 0x5, preloaded"]


def test_sigterm_while_the_nodes_boot_stops_them_and_exits_130() -> None:
    serve = ServeProcess(["serve", "--nodes", "1", "--port", "0"])
    deadline = time.monotonic() + 60
    while not (nodes := [pid for pid in descendants(serve.process.pid)
                         if "swactor.cli node" in cmdline(pid)]):
        assert time.monotonic() < deadline and serve.process.poll() is None, serve.describe()
        time.sleep(0.05)
    code = serve.stop(60)
    assert code == 130, serve.describe()
    assert "swactor serve: interrupted" in serve.stderr
    assert [pid for pid in nodes if cmdline(pid)] == []  # every node it started is gone


class _Handle:
    """A run handle that records what it is told; `end()` ends the run."""

    def __init__(self) -> None:
        self.told: list[object] = []
        self.future: asyncio.Future[object] = asyncio.get_running_loop().create_future()

    def tell(self, message: object) -> None:
        self.told.append(message)

    def end(self) -> None:
        self.future.set_result(None)


def test_live_nodes_tell_a_watched_run_each_of_its_nodes_lost() -> None:
    async def scenario() -> None:
        members = tuple(PoolMember(NodeId(n), "127.0.0.1", 7400 + n) for n in (1, 2, 3, 4))
        live = LiveNodes(members, count=3)
        handle = _Handle()
        watch = asyncio.create_task(
            live.watch(handle, frozenset({NodeId(1), NodeId(2), NodeId(3)})))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        live.observe(_change(2, MemberState.Suspect, meta=False))
        live.observe(_change(4, MemberState.Dead))  # the spare: not the run's
        assert handle.told == []
        live.observe(_change(2, MemberState.Dead))
        assert handle.told == [orun.MembershipLost(NodeId(2))]
        handle.end()
        await watch
        live.observe(_change(3, MemberState.Dead))  # the run ended: nothing more told
        assert handle.told == [orun.MembershipLost(NodeId(2))]
        late = _Handle()  # a run started on a node already gone is told at once
        late_watch = asyncio.create_task(
            live.watch(late, frozenset({NodeId(1), NodeId(3)})))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        assert late.told == [orun.MembershipLost(NodeId(3))]
        late.end()
        await late_watch

    asyncio.run(scenario())


def test_live_nodes_tell_a_run_at_once_when_a_started_node_exits() -> None:
    async def scenario() -> None:
        members = tuple(PoolMember(NodeId(n), "127.0.0.1", 7400 + n) for n in (1, 2, 3, 4))
        live = LiveNodes(members, count=3)
        loop = asyncio.get_running_loop()
        exits: dict[int, asyncio.Future[int]] = {n: loop.create_future() for n in (1, 2, 3, 4)}
        for node, exited in exits.items():
            live.follow_exit(NodeId(node), exited)
        handle = _Handle()
        watch = asyncio.create_task(
            live.watch(handle, frozenset({NodeId(1), NodeId(2), NodeId(3)})))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        assert handle.told == []
        exits[2].set_result(-9)  # stage 1's node killed: no SWIM verdict needed
        for _ in range(3):
            await asyncio.sleep(0)
        assert handle.told == [orun.MembershipLost(NodeId(2))]
        assert [int(m.node_id) for m in live.members()] == [1, 3, 4]
        live.observe(_change(2, MemberState.Alive))  # a stale Alive does not bring it back
        assert [int(m.node_id) for m in live.members()] == [1, 3, 4]
        handle.end()
        await watch
        await live.close()  # stops watching the others
        assert all(exits[n].cancelled() for n in (1, 3, 4))

    asyncio.run(scenario())
