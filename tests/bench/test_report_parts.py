"""The report's arithmetic: event intervals, profile folding, goal verdicts, model lines.

Events are written here with chosen timestamps, so each expected interval is known from
the inputs, not from the code under test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench._lifecycle import (
    EventsError,
    RunEvents,
    bring_up,
    read_events,
    split_inbound,
    stage_breakdown,
    token_periods_ms,
)
from bench._profile import _REPO, summarise
from bench.report import coldstart_goals, model_figures, verdict

MS = 1_000_000


def _ev(event: str, mono_ms: float, **fields: Any) -> dict[str, Any]:
    return {"schema": 1, "event": event, "mono": int(mono_ms * MS), "run_id": 7, **fields}


def two_stage_run() -> list[dict[str, Any]]:
    """Two stages; each decode token: 1 ms hop in, 0.5 ms control, compute 10 / 20 ms."""
    events = [_ev("stage_ready", 0, node_id=100, stage_index=0),
              _ev("stage_ready", 0, node_id=200, stage_index=1)]
    t = 1000.0
    for s in range(6):
        for stage, compute in ((0, 10.0), (1, 20.0)):
            t += 1.0
            events.append(_ev("object_loaded", t, stage_index=stage, sequence=s,
                              detail={"extent": 2304 if stage else 4}))
            t += 0.5
            events.append(_ev("execute_step_started", t, stage_index=stage, sequence=s))
            t += compute
            events.append(_ev("object_produced", t - 0.1, stage_index=stage, sequence=s))
            events.append(_ev("step_completed", t, stage_index=stage, sequence=s))
        t += 2.0
        events.append(_ev("token_received", t, sequence=s))
    return events


def test_breakdown_adds_up_to_the_period_and_names_each_part() -> None:
    run = RunEvents(two_stage_run())
    assert run.stages == 2
    # period: 2 x (1 + 0.5) hops/control + 10 + 20 compute + 2 orchestrator = 35 ms
    assert token_periods_ms(run, warmup=1) == pytest.approx([35.0] * 4)
    stage0, stage1 = stage_breakdown(run, warmup=1)
    assert stage0["compute"] == pytest.approx([10.0] * 4)
    assert stage1["compute"] == pytest.approx([20.0] * 4)
    assert stage0["control"] == pytest.approx([0.5] * 4)
    # stage 0's inbound starts at the previous token; stage 1's at stage 0's object_produced
    assert stage0["inbound"] == pytest.approx([1.0] * 4)
    assert stage1["inbound"] == pytest.approx([1.1] * 4)
    assert stage0["waiting"] == pytest.approx([35.0 - 11.5] * 4)
    assert stage1["waiting"] == pytest.approx([35.0 - 21.6] * 4)
    assert stage1["extent"] == [2304.0] * 4


def test_warmup_tokens_are_left_out_and_a_missing_event_is_named() -> None:
    records = two_stage_run()
    run = RunEvents(records)
    assert run.decode_sequences(warmup=3) == [4, 5]
    assert run.decode_sequences(warmup=5) == []
    with pytest.raises(EventsError, match="no decode token"):
        stage_breakdown(run, warmup=5)
    holed = [r for r in records if not (r["event"] == "step_completed"
                                        and r.get("stage_index") == 1 and r["sequence"] == 5)]
    stage0, stage1 = stage_breakdown(RunEvents(holed), warmup=1)
    assert len(stage0["compute"]) == len(stage1["compute"]) == 3  # token 5 left out
    with pytest.raises(EventsError, match="step_completed for stage 1 sequence 5"):
        RunEvents(holed).at("step_completed", 1, 5)


def test_other_runs_are_ignored(tmp_path: Path) -> None:
    records = two_stage_run()
    stray = _ev("token_received", 1.0, sequence=2)
    stray["run_id"] = 8
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [stray, *records]) + "\nnot json\n")
    run = RunEvents(read_events([path]), run_id=7)
    assert token_periods_ms(run, warmup=1) == pytest.approx([35.0] * 4)


def test_bring_up_intervals() -> None:
    events = [
        _ev("node_started", 0, node_id=100), _ev("node_available", 2500, node_id=100),
        _ev("pool_ready", 3000),
        _ev("weights_download_started", 3100, node_id=100, stage_index=0),
        _ev("weights_downloaded", 4000, node_id=100, stage_index=0),
        _ev("weights_loaded", 9000, node_id=100, stage_index=0),
        _ev("stage_ready", 9001, node_id=100, stage_index=0),
        _ev("readiness_barrier_passed", 9500),
    ]
    up = bring_up(RunEvents(events))
    assert up["pool_ready_to_barrier_s"] == pytest.approx(6.5)
    assert up["node_start_to_available_s"] == pytest.approx([2.5])
    assert up["stages"][0]["pool_to_weights_loaded_s"] == pytest.approx(6.0)
    assert up["stages"][0]["pool_to_downloaded_s"] == pytest.approx(1.0)


def test_split_inbound() -> None:
    # 4 copies of 2.5 MB at 10 GB/s = 1 ms of a 3 ms hop
    assert split_inbound(3.0, 2.5e6, 10.0) == pytest.approx((1.0, 2.0))
    # never more ring time than the hop itself
    assert split_inbound(0.5, 2.5e6, 10.0) == pytest.approx((0.5, 0.0))


def test_profile_folds_self_and_inclusive() -> None:
    raw = (f"main (/a/site-packages/x.py:1);step ({_REPO}swactor/m.py:5);"
           "matmul (/a/site-packages/tinygrad/t.py:9) 6\n"
           f"main (/a/site-packages/x.py:1);step ({_REPO}swactor/m.py:7) 3\n"
           "main (/a/site-packages/x.py:2);read (/a/lib/python3.11/json.py:3) 1\n")
    out = summarise(raw)
    assert out["samples"] == 10
    assert out["self"][0] == {"function": "matmul (tinygrad/t.py)", "share": 0.6}
    inclusive = {row["function"]: row["share"] for row in out["inclusive"]}
    assert inclusive["main (x.py)"] == 1.0
    assert inclusive["step (swactor/m.py)"] == 0.9
    assert summarise("")["samples"] == 0


def test_verdicts_say_by_how_much() -> None:
    assert verdict(0.95, 0.9, at_least=True) == "met"
    assert verdict(0.45, 0.9, at_least=True).startswith("missed by 50%")
    assert verdict(0.8, 1.0, at_least=False) == "met"
    assert verdict(1.5, 1.0, at_least=False).startswith("missed by 50% over")


def test_model_lines_parse() -> None:
    text = ("  f16 (beam 2): load 3.0 s; prefill 64 tokens   90.0 tok/s warm (2.0 s cold); "
            "decode   29.5 tok/s median, 28.0 mean over 37 tokens\n"
            "  f32 (beam 2): load 3.0 s; decode   20.25 tok/s median, 19.0 mean\n"
            "  llama.cpp decode 70.0 tok/s on 2 threads; ours/llama.cpp = 0.42x (goal 0.8x)\n"
            "  llama.cpp prefill 64 tokens 180.0 tok/s warm on 2 threads; ours (f32:blocks) / "
            "llama.cpp = 1.14x (goal 0.5x)\n")
    assert model_figures(text) == {"ours_tokens_per_s": {"f16": 29.5, "f32": 20.25},
                                   "llama_cpp_tokens_per_s": 70.0,
                                   "prefill_over_llama_cpp": 1.14}
    skipped = model_figures("llama.cpp: skipped")
    assert skipped["llama_cpp_tokens_per_s"] is None
    assert skipped["prefill_over_llama_cpp"] is None


def test_cold_start_rows_judge_each_figure_against_its_goal() -> None:
    figures = {"nodes": 3, "tokenize_s": 0.31, "tokenize_cpu_s": 0.17, "modes": {
        "blocks": {"cold": {"first_token_s": 0.9, "load_s": 70.0},
                   "warm": {"first_token_s": 2.5, "load_s": 2.9},
                   "demo_over_single_stage": 0.5}}}
    rows = {row["goal"]: row for row in coldstart_goals(figures)}
    assert rows["swactor tokenize, whole command (s wall)"]["verdict"] == "met"
    warm = rows["first token after the barrier, warm kernel cache (s) [blocks]"]
    assert warm["measured"]["median"] == 2.5 and warm["verdict"].startswith("missed")
    cold = rows["first token after the barrier, first run ever (s) [blocks]"]
    assert cold["verdict"] == "met" and "70.0" in cold["note"]
    assert rows["pool ready -> barrier, warm kernel cache (s) [blocks]"]["verdict"] == "met"
    ratio = rows["second run decode / single stage, same weights [blocks]"]
    assert ratio["verdict"].startswith("missed")
    (missing,) = coldstart_goals(None)
    assert missing["verdict"] == "not measured"


def test_hotpath_ratios_and_fixed_costs() -> None:
    from bench.hotpath import round_figures

    model = {"step_ms": 30.0, "cpu_ms": 29.0}
    one = {"stages": 1, "period_ms": 32.0, "compute_ms": 31.0, "cpu_ms_per_token": 32.0,
           "node_cpu_ms": 0.8}
    three = {"stages": 3, "period_ms": 34.0, "compute_ms": 31.6, "cpu_ms_per_token": 35.0,
             "node_cpu_ms": 1.1, "node_main_cpu_ms": 0.7}
    got = round_figures(model, one, three)
    assert got["e2e_over_model"] == 30.0 / 32.0
    assert got["e2e_over_model_cpu"] == 29.0 / 32.0
    assert got["three_over_one"] == 32.0 / 34.0
    assert got["three_over_one_cpu"] == 32.0 / 35.0
    assert got["fixed_ms_per_stage_1"] == 1.0
    assert abs(got["fixed_ms_per_stage_3"] - 0.8) < 1e-9  # (34 - 31.6) / 3
    assert got["fixed_cpu_ms_per_stage_3"] == 2.0  # (35 - 29) / 3
    assert got["node_cpu_ms_per_token"] == 1.1
    assert got["node_main_cpu_ms_per_token"] == 0.7  # the 1-stage run did not measure it


def _stage(inbound: float, control: float, compute: float) -> dict[str, Any]:
    return {"inbound_ms": inbound, "control_ms": control, "compute_ms": compute}


def test_limits_explain_the_per_token_path_and_the_serving_ratio() -> None:
    from bench._render import _hotpath_limits, _serve_limits

    one = {"period_ms": 40.0, "compute_ms": 35.0, "orchestrator_cpu_ms": 2.0}
    three = {"period_ms": 50.0, "compute_ms": 38.0, "node_cpu_ms": 2.5,
             "per_stage": [_stage(1.0, 0.1, 9.0), _stage(3.0, 0.3, 9.0),
                           _stage(2.0, 0.2, 20.0)]}
    lines = _hotpath_limits({"rounds": [{"model": {"step_ms": 33.0}, "one": one,
                                         "three": three}]})
    assert "the model alone steps in 33.0 ms" in lines[0]
    assert "inbound hop, 2.00 ms median" in lines[0] and "control 0.20 ms" in lines[0]
    assert _hotpath_limits(None) == []

    level = {"aggregate_tokens_per_s": 10.0, "decode_p50_tokens_per_s": 5.0}
    served = _serve_limits({"levels": {
        "swactor-3": {"1": level, "4": {**level, "aggregate_tokens_per_s": 18.0}},
        "llama.cpp": {"1": level, "4": {**level, "aggregate_tokens_per_s": 9.5}}}})
    assert "aggregate 10.0 tok/s with 1 client, 18.0 with 4 (1.80x)" in served[0]
    assert "three share" in served[0]
    assert "0.95x its 1-client aggregate" in served[1]
