"""`swactor node | orchestrator | run` argument handling and the stage-run control
messages (fast: nothing boots)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from swactor.cli import main
from swactor.cliargs import at_least, port_number
from swactor.cliargs import node_id as parse_node_id
from swactor.events.emitter import add_event_arguments
from swactor.fsm.generated import orchestrator_run as orun
from swactor.orchestrator.orchestrate_cmd import parse_member
from swactor.transport.run_control import (
    REGISTRY,
    AddressBook,
    PeerAddress,
    StageFaultReport,
    StageReadyReport,
    StopRunMessage,
    report_event,
    report_message,
)
from swactor.wire import Component, NodeId, RunFaultReason, RunId, StageFootprint, StageIndex
from swactor.wire.errors import WireError


def test_node_ids_parse_in_every_printed_form() -> None:
    assert parse_node_id("42") == 42
    assert parse_node_id("0x2a") == 42
    assert parse_node_id("000000000000002a") == 42  # `swactor node-id` prints 16 hex digits
    for bad in ("", "node", "-1", "0x", str(1 << 64)):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_node_id(bad)


def test_at_least_keeps_its_bound_and_names_a_smaller_value() -> None:
    assert at_least(0)("0") == 0
    assert at_least(1)("7") == 7
    with pytest.raises(argparse.ArgumentTypeError, match=r"^0 must be at least 1$"):
        at_least(1)("0")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^'x' is not an integer$"):
        at_least(0)("x")


@pytest.mark.parametrize(("argv", "words"), [
    (["--events-max-bytes", "0"], "--events-max-bytes: 0 must be at least 1"),
    (["--events-keep", "-1"], "--events-keep: -1 must be at least 0"),
])
def test_event_flags_refuse_what_the_events_file_cannot_use(
        argv: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="swactor node")
    add_event_arguments(parser)
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(argv)
    assert exited.value.code == 2
    assert words in capsys.readouterr().err


def test_port_numbers_are_0_to_65535() -> None:
    assert port_number("0") == 0
    assert port_number("65535") == 65535
    for bad, words in (("65536", "65536 is not a port number (0..65535)"),
                       ("-1", "-1 must be at least 0"), ("http", "'http' is not an integer")):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(words)):
            port_number(bad)


def test_pool_members_parse() -> None:
    member = parse_member("0x2a@10.0.0.5:7400")
    assert (member.node_id, member.host, member.port) == (42, "10.0.0.5", 7400)
    for bad in ("42", "42@10.0.0.5", "42@:7400", "42@h:0", "42@h:70000", "x@h:1"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_member(bad)


def test_stage_reports_round_trip_through_json() -> None:
    run = RunId(9)
    events: list[orun.StageReady | orun.StageFault | orun.StageStopped] = [
        orun.StageReady(StageIndex(1)),
        orun.StageFault(StageIndex(2), RunFaultReason.WeightLoadFailed, Component.Worker),
        orun.StageStopped(StageIndex(0), False),
    ]
    registry = {tp.__name__: tp for tp in REGISTRY}
    for event in events:
        message = report_message(run, event)
        assert message.run_id == run
        decoded = registry[type(message).__name__].from_json(message.to_json())
        assert report_event(decoded) == event
    assert report_event(StopRunMessage(run, StageIndex(0))) is None
    footprint = StageFootprint(weights_bytes=5, kv_cache_bytes=6, rss_bytes=7, file_bytes=4)
    ready = report_message(run, orun.StageReady(StageIndex(1)), footprint)
    assert StageReadyReport.from_json(ready.to_json()) == StageReadyReport(
        run, StageIndex(1), footprint)


def test_control_messages_reject_bad_fields() -> None:
    with pytest.raises(WireError):
        PeerAddress(NodeId(1), "10.0.0.1", 0)
    with pytest.raises(WireError):
        PeerAddress(NodeId(1), "", 7400)
    with pytest.raises(WireError):
        StageFaultReport.from_json({"run_id": 1, "stage_index": 0, "reason": "Nope",
                                    "component": "worker"})
    book = AddressBook((PeerAddress(NodeId(1), "10.0.0.1", 7400),))
    assert AddressBook.from_json(book.to_json()) == book


def test_orchestrator_needs_exactly_one_way_to_name_the_pool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = str(tmp_path / "o.key")
    assert main(["orchestrator", "--key", key]) == 2
    assert "--node" in capsys.readouterr().err
    assert main(["orchestrator", "--key", key, "--node", "1@127.0.0.1:9",
                 "--seed", "127.0.0.1:7946"]) == 2
    assert "not both" in capsys.readouterr().err


def test_a_wildcard_bind_needs_an_advertised_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["orchestrator", "--key", str(tmp_path / "o.key"), "--bind", "0.0.0.0",
                 "--node", "1@127.0.0.1:9"]) == 2
    assert "--advertise" in capsys.readouterr().err
    assert main(["node", "--key", str(tmp_path / "n.key"), "--trust-orchestrator", "1",
                 "--bind", "0.0.0.0", "--swim", "127.0.0.1:7946"]) == 2
    assert "--advertise" in capsys.readouterr().err


def test_missing_model_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["orchestrator", "--key", str(tmp_path / "o.key"), "--node", "1@127.0.0.1:9",
                 "--open-pool", "--model", str(tmp_path / "absent.gguf")])
    err = capsys.readouterr().err
    assert code == 2 and "absent.gguf not found" in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [
    ["node", "--key", "k"],  # no --trust-orchestrator
    ["node", "--key", "k", "--trust-orchestrator", "zz"],
    ["node", "--key", "k", "--trust-orchestrator", "1", "--arena-ceiling", "lots"],
    ["run", "--nodes", "0"],
    ["run", "--split", "10,x"],
    ["node", "--key", "k", "--trust-orchestrator", "1", "--weights", "int4"],
    ["node", "--key", "k", "--trust-orchestrator", "1", "--quic", "70000"],
    ["run", "--weights", "int4"],
    ["run", "--threads", "0"],
    ["node", "--key", "k", "--trust-orchestrator", "1", "--threads", "999"],
    ["serve", "--threads", "two"],
])
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_run_gives_its_nodes_the_weight_mode(tmp_path: Path) -> None:
    from swactor.cluster.launcher import LocalCluster

    argv = LocalCluster(2, tmp_path / "keys", weights="blocks")._argv(1)
    assert argv[argv.index("--weights") + 1] == "blocks"
    assert "--weights" in argv and argv[argv.index("node") - 1] == "swactor.cli"
    assert "--threads" not in argv  # the node's default
    argv = LocalCluster(2, tmp_path / "keys", threads=1)._argv(0)
    assert argv[argv.index("--threads") + 1] == "1"


def test_ctrl_c_while_the_nodes_boot_stops_them(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    keys = tmp_path / "keys"
    run = subprocess.Popen(
        [sys.executable, "-m", "swactor.cli", "run", "--nodes", "2", "--keys-dir", str(keys)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while not ((keys / "node-0.key").exists() and (keys / "node-1.key").exists()):
            assert time.monotonic() < deadline and run.poll() is None
            time.sleep(0.05)
        run.send_signal(signal.SIGINT)
        out, _ = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 130 and "swactor run: interrupted" in out, out[-2000:]
    assert "Traceback" not in out
    left = subprocess.run(["pgrep", "-f", str(keys)], capture_output=True, text=True).stdout
    assert left.split() == []


@pytest.mark.parametrize("command", ["orchestrator", "run"])
def test_offer_model_reaches_the_session(command: str, tmp_path: Path) -> None:
    from swactor.cli import build_parser
    from swactor.orchestrator.orchestrate_cmd import session_options
    from swactor.transport.identity import NodeIdentity

    parser = build_parser()
    extra = ["--key", str(tmp_path / "o.key"), "--node", "1@127.0.0.1:9"] \
        if command == "orchestrator" else []
    identity = NodeIdentity.generate()
    # `swactor orchestrator`'s nodes may not have the file: offered unless told not to;
    # `swactor run`'s nodes share this machine's disk: not offered unless asked
    default = command == "orchestrator"
    for flags, offered in (([], default), (["--offer-model"], True),
                           (["--no-offer-model"], False)):
        args = parser.parse_args([command, *extra, *flags])
        assert session_options(args, identity, ()).offer_model is offered, flags
