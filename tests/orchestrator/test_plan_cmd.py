"""`swactor plan`: a table or the RunPlan JSON; bad input is one line and exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swactor.cli import main
from swactor.model.paths import default_model_path
from swactor.wire import EdgeKind, RunPlan


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_is_a_valid_run_plan(tiny_gguf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "--model", str(tiny_gguf), "--nodes", "2", "--json",
                             "--max-tokens", "8", "--run-id", "77", "--first-edge-id", "500")
    assert code == 0, err
    plan = RunPlan.from_json(json.loads(out))
    assert int(plan.run_id) == 77
    assert [(s.layer_start, s.layer_end_exclusive) for s in plan.stages] == [(0, 3), (3, 6)]
    assert [int(e.edge_id) for e in plan.edges] == [500, 501, 502]
    assert plan.max_tokens == 8


def test_table_lists_stages_and_edges(tiny_gguf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--model", str(tiny_gguf), "--split", "1,2,3",
                           "--first-edge-id", "40", "--max-seq-len", "32", "--max-tokens", "4")
    assert code == 0
    lines = out.splitlines()
    stage_rows = [line.split() for line in lines if line[:1].isdigit() and "cpu" in line]
    assert [row[3] for row in stage_rows] == ["0..1", "1..3", "3..6"]
    edge_rows = {line.split()[0]: line.split() for line in lines if line.startswith("4")}
    assert edge_rows["40"][1] == EdgeKind.TokenIn.value
    assert edge_rows["43"][1] == EdgeKind.TokenOut.value
    assert "max_seq_len 32" in out


def test_pool_file(tiny_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pool = tmp_path / "pool.json"
    pool.write_text(json.dumps({
        "orchestrator_node_id": 9,
        "nodes": [
            {"node_id": 21, "usable_memory_bytes": "2 GiB", "device_kind": "cuda"},
            {"node_id": 22, "usable_memory_bytes": 1 << 30},
        ],
    }))
    code, out, err = run_cli(capsys, "--model", str(tiny_gguf), "--pool", str(pool), "--json",
                             "--max-tokens", "4")
    assert code == 0, err
    plan = RunPlan.from_json(json.loads(out))
    assert [int(s.node_id) for s in plan.stages] == [21, 22]
    assert [s.layer_end_exclusive - s.layer_start for s in plan.stages] == [4, 2]
    assert int(plan.orchestrator_node) == 9


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--split", "1,2,4"], "SplitSumMismatch: the split 1,2,4 sums to 7"),
        (["--nodes", "7"], "TooManyStages: 7 nodes but the model has only 6 blocks"),
        (["--nodes", "2", "--node-memory", "0"], "ZeroMemoryNode"),
        (["--nodes", "2", "--node-memory", "lots"], "not a byte count"),
        (["--max-tokens", "200"], "MaxTokensInvalid"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tiny_gguf: Path, capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    code, out, err = run_cli(capsys, "--model", str(tiny_gguf), *argv)
    assert code == 2
    assert out == ""
    assert words in err
    assert len(err.strip().splitlines()) == 1


def test_unreadable_pool_and_model(
    tiny_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "pool.json"
    bad.write_text('{"nodes": [{"node_id": "one", "usable_memory_bytes": 1}]}')
    code, _, err = run_cli(capsys, "--model", str(tiny_gguf), "--pool", str(bad))
    assert code == 2 and "nodes[0].node_id: must be an integer" in err
    code, _, err = run_cli(capsys, "--model", str(tmp_path / "none.gguf"))
    assert code == 2 and "ModelUnreadable" in err and len(err.strip().splitlines()) == 1


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["plan", "--split", "ten,ten"])
    assert info.value.code == 2
    assert "comma-separated" in capsys.readouterr().err


@pytest.mark.slow
def test_smollm2_three_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    if not default_model_path().is_file():
        pytest.fail(f"{default_model_path()} missing: run scripts/setup.sh")
    code, out, err = run_cli(capsys, "--nodes", "3", "--json", "--first-edge-id", "1")
    assert code == 0, err
    plan = RunPlan.from_json(json.loads(out))
    assert [(s.layer_start, s.layer_end_exclusive) for s in plan.stages] == [
        (0, 10), (10, 20), (20, 30)
    ]
    activation = next(e for e in plan.edges if e.kind is EdgeKind.Activation)
    assert activation.object_spec.max_extent == 2048 * 576 * 4
    assert plan.model.eos_token_id == 2


def test_ready_footprint_is_printed_beside_the_prediction() -> None:
    from swactor.orchestrator.model_info import StageMemory
    from swactor.orchestrator.plan_cmd import footprint_text
    from swactor.wire import StageFootprint

    mib = 1 << 20
    actual = StageFootprint(weights_bytes=101 * mib, kv_cache_bytes=30 * mib,
                            rss_bytes=190 * mib, file_bytes=100 * mib)
    predicted = StageMemory(weights=101 * mib, kv_cache=30 * mib, file_bytes=100 * mib)
    assert footprint_text(actual, predicted) == (
        "weights 101.0 MiB = 1.01x its 100.0 MiB in the file (predicted 101.0 MiB), "
        "KV cache 30.0 MiB (predicted 30.0 MiB), worker RSS 190.0 MiB")
    assert footprint_text(actual, None).startswith("weights 101.0 MiB = 1.01x its 100.0 MiB")
    assert footprint_text(None, predicted) == ""  # a role that holds no model


def test_stage_progress_prints_ready_lines_with_memory_and_faults() -> None:
    """`swactor run` and `swactor serve` print their stage lines through StageProgress."""
    import io

    from swactor.fsm.generated import orchestrator_run as orun
    from swactor.orchestrator.model_info import StageMemory
    from swactor.orchestrator.session import StageProgress
    from swactor.wire import Component, RunFaultReason, StageFootprint, StageIndex

    mib = 1 << 20
    out = io.StringIO()
    progress = StageProgress(out, [StageMemory(weights=50 * mib, kv_cache=8 * mib,
                                               file_bytes=50 * mib)] * 2, 2)
    progress(orun.StageReady(StageIndex(1)),
             StageFootprint(weights_bytes=50 * mib, kv_cache_bytes=8 * mib,
                            rss_bytes=120 * mib, file_bytes=50 * mib))
    progress(orun.StageFault(StageIndex(0), RunFaultReason.WorkerCrashed, Component.Worker),
             None)
    progress(orun.StageReady(StageIndex(0)), None)  # a role that reported no footprint
    assert out.getvalue().splitlines() == [
        "[swactor] stage 1 ready (1/2): weights 50.0 MiB = 1.00x its 50.0 MiB in the file "
        "(predicted 50.0 MiB), KV cache 8.0 MiB (predicted 8.0 MiB), worker RSS 120.0 MiB",
        "[swactor] stage 0 fault: WorkerCrashed (worker)",
        "[swactor] stage 0 ready (2/2)",
    ]
