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
    assert "stages share this machine's CPUs" in served[0]
    assert "0.95x its 1-client aggregate" in served[1]


def test_one_stage_serving_limit_bounds_the_ratio_by_its_prefills() -> None:
    """A 1-client request of 200 ms TTFT and 16 more tokens at 80 tok/s (0.2 s): 4
    clients' 4 prefills (0.8 s) and one decode (0.2 s) against 4 x 0.4 s -> at most 1.6x;
    a row without the figures gives no bound."""
    from bench._render import _serve_limits, prefill_bound

    one = {"requests": 2, "tokens": 34, "ttft_p50_ms": 200.0,
           "decode_p50_tokens_per_s": 80.0, "aggregate_tokens_per_s": 40.0}
    assert prefill_bound(one) == pytest.approx(1.6)
    assert prefill_bound({**one, "requests": 0}) is None
    assert prefill_bound({**one, "decode_p50_tokens_per_s": 0.0}) is None
    served = _serve_limits({"levels": {"swactor-1": {
        "1": one, "4": {**one, "aggregate_tokens_per_s": 60.0}}}})
    assert "(1.50x)" in served[0] and "at most 1.60x" in served[0]
    assert "200 ms before its first token and 16.0 more tokens at 80.0 tok/s" in served[0]


def _recovery_figures() -> dict[str, Any]:
    """`bench recovery --json` for chosen trials: a cold-spare serving row over two trials
    (next token 2.9 s and 3.0 s, of which the new run's load 2.0 s and 2.2 s: 0.9 s and
    0.8 s beyond it; one token lost in the second), a warm-spare row at 2.5 s (over its
    2 s goal, teardown the largest phase), a node kill detected within SWIM's bound, a
    link down detected past it, a worker kill (no numeric bound) and a failed kind."""
    from bench.recovery import Trial, as_json

    def serve(next_s: float, lost: float, **phases: float) -> dict[str, float]:
        return {"teardown_s": 0.4, "ready_s": 2.5, "next_token_s": next_s, "lost": lost,
                "duplicated": 0.0} | {f"phase_{k}_s": v for k, v in phases.items()}

    cold = {"detect": 0.02, "teardown": 0.4, "replan": 0.03, "barrier": 0.0, "resubmit": 0.0}
    trials = {
        "serve_node_kill": [
            Trial("serve_node_kill", "MembershipLost", "membership", 0.02,
                  serve(2.9, 0.0, provision=2.0, prefill=0.45, **cold)),
            Trial("serve_node_kill", "MembershipLost", "membership", 0.02,
                  serve(3.0, 1.0, provision=2.2, prefill=0.35, **cold))],
        "serve_spare_kill": [Trial("serve_spare_kill", "MembershipLost", "membership", 0.02,
                                   serve(2.5, 0.0, **cold | {"teardown": 1.6},
                                         provision=0.03, prefill=0.4))],
        "node_kill": [Trial("node_kill", "MembershipLost", "membership", 3.0, {}),
                      Trial("node_kill", "MembershipLost", "membership", 4.0, {})],
        "link_down": [Trial("link_down", "MembershipLost", "membership", 9.0, {})],
        "worker_kill": [Trial("worker_kill", "WorkerCrashed", "worker_ctl", 0.02, {})],
        "stream_reset": [],
    }
    return as_json(list(trials), trials, {"stream_reset": "failed: Failed: no tokens"}, 0.25)


def test_recovery_json_holds_each_kinds_figures_and_numeric_bound() -> None:
    from bench.recovery import MEMBERS
    from swactor.membership import SwimConfig, detection_bound_s

    rows = {row["kind"]: row for row in _recovery_figures()["rows"]}
    swim = detection_bound_s(SwimConfig(), MEMBERS)
    assert rows["node_kill"]["bound_s"] == swim and rows["link_down"]["bound_s"] == swim
    assert rows["node_kill"]["figures"]["detect_s"] == {"min": 3.0, "median": 3.5,
                                                        "max": 4.0, "n": 2}
    assert rows["worker_kill"]["bound_s"] is None
    assert rows["serve_spare_kill"]["spares"] == 1 and rows["node_kill"]["spares"] is None
    cold = rows["serve_node_kill"]["figures"]
    assert cold["phase_provision_s"]["median"] == pytest.approx(2.1)
    assert cold["lost"] == {"min": 0.0, "median": 0.5, "max": 1.0, "n": 2}
    assert rows["stream_reset"]["figures"] == {}
    assert rows["stream_reset"]["note"] == "failed: Failed: no tokens"


def test_recovery_rows_judge_next_token_beyond_the_load_counts_and_bounds() -> None:
    from bench.report import recovery_goals

    rows = {row["goal"]: row for row in recovery_goals(_recovery_figures())}
    cold = rows["node kill -> next token of each migrated stream - the new run's load (s) "
                "[swactor serve, cold spare]"]
    # per trial 2.9 - 2.0 and 3.0 - 2.2: the load is taken out, so 0.85 s < 1 s is met
    assert cold["measured"]["min"] == pytest.approx(0.8)
    assert cold["measured"]["max"] == pytest.approx(0.9)
    assert cold["measured"]["median"] == pytest.approx(0.85)
    assert cold["target"] == 1.0 and cold["verdict"] == "met"
    warm = rows["node kill -> next token of each migrated stream (s) "
                "[swactor serve, warm spare]"]
    assert warm["measured"]["median"] == 2.5 and warm["target"] == 2.0
    assert warm["verdict"].startswith("missed")
    lost = rows["tokens lost over every migrated stream [swactor serve, cold spare]"]
    assert lost["measured"]["median"] == 1.0 and lost["verdict"].startswith("missed")
    duplicated = rows["tokens duplicated over every migrated stream [swactor serve, cold spare]"]
    assert duplicated["measured"]["median"] == 0.0 and duplicated["verdict"] == "met"
    node = rows["fault -> detection (s) [node kill (SIGKILL stage 1's node)]"]
    assert node["measured"]["median"] == 3.5 and node["verdict"] == "met"
    link = rows["fault -> detection (s) [host cut off (netns link down)]"]
    assert link["verdict"].startswith("missed")
    assert not any("worker kill (SIGKILL" in name for name in rows)  # no numeric bound
    (missing,) = recovery_goals(None)
    assert missing["verdict"] == "not measured"


def test_recovery_limits_name_the_dominant_phase_of_a_missed_recovery() -> None:
    from bench._render import _recovery_limits
    from bench.report import recovery_goals

    figures = _recovery_figures()
    report = {"recovery_goal": figures, "goals": recovery_goals(figures)}
    lines = _recovery_limits(report)
    (warm,) = [line for line in lines if "warm spare" in line and "next token" in line]
    assert "next token 2.50 s" in warm and "teardown dominates (1.60 s)" in warm
    (link,) = [line for line in lines if line.startswith("- Detection")]
    assert "9.00 s" in link and "MembershipLost (membership)" in link
    (lost,) = [line for line in lines if "token(s) lost" in line]
    assert "1 token(s) lost over 2 trial(s)" in lost
    # a cold row over its goal: the phases beyond the load are weighed, not the load
    slow = _recovery_figures()
    for trial in slow["rows"][0]["trials"]:
        trial["extra"]["next_token_s"] += 1.0
    slow["rows"][0]["figures"]["phase_prefill_s"]["median"] = 1.5
    (cold,) = [line for line in _recovery_limits({"recovery_goal": slow,
                                                 "goals": recovery_goals(slow)})
               if "cold spare" in line and "next token" in line]
    assert "beyond the new run's load (provision), prefill dominates (1.50 s of" in cold


def test_decode_limit_reads_the_fastest_variants_thread_scaling() -> None:
    """`bench model` prints a thread-scaling line per variant; the limits line quotes the
    fastest variant's, not the first printed."""
    from bench._render import _model_limits

    output = "\n".join([
        "  f16_dense (beam 0): decode   20.3 tok/s median",
        "    decode by threads: 1 thread 11.5 tok/s, 2 threads 20.3 tok/s; 2/1 = 1.76x; equal",
        "  f16_blocks (beam 0): decode   71.4 tok/s median",
        "    decode by threads: 1 thread 47.7 tok/s, 2 threads 71.4 tok/s; 2/1 = 1.50x; equal",
        "  fastest: f16:blocks",
        "  llama.cpp decode 57.0 tok/s on 1 thread; ours (f16:blocks) on 1 thread / llama.cpp"
        " 1 thread = 0.84x"])
    report = {"modules": [{"name": "model", "output": output}],
              "model_goal": {"llama_cpp_tokens_per_s": 117.9},
              "goals": [{"goal": "llama.cpp decode ratio", "verdict": "missed by 24%"}]}
    line = _model_limits(report)[0]
    assert "1.50x one thread's rate on 2 threads" in line and "1.76x" not in line
    assert "thread for thread we decode at 0.84x llama.cpp" in line


def test_node_profile_line_names_the_event_lines_when_they_lead() -> None:
    """The node's profile line says what writing lifecycle event lines costs when they are
    among its leading entries, and that they are not otherwise."""
    from bench._render import _event_lines_share

    def row(function: str, share: float) -> dict[str, Any]:
        return {"function": f"{function} (swactor/x.py)", "share": share}

    leading = {"self": [row("EpollSelector.select", 0.2), row("JsonlSink._write_locked", 0.11),
                        row("UdpSocket._sendto", 0.09), row("LifecycleEvent.__post_init__", 0.06)]}
    assert "lifecycle event lines takes 17%" in _event_lines_share(leading)
    quiet = {"self": [row("EpollSelector.select", 0.2), row("UdpSocket._sendto", 0.09)]}
    assert "no state machine or event line" in _event_lines_share(quiet)
