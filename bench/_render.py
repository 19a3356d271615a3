"""`bench/report.md` from the report dict that `bench.report` builds (and writes as JSON).

Theory of operation: pure formatting. Every number printed here is in the JSON beside
it; the only arithmetic is aggregation for display (medians of per-run medians) and the
differences in "what limits it", which subtract figures of the same report.
"""

from __future__ import annotations

import re
import statistics
from typing import Any

COLUMNS = ("compute_ms", "ring_ms", "quic_ms", "control_ms", "waiting_ms")


def _spread(spread: dict[str, float] | None, digits: int = 2) -> str:
    if not spread:
        return "n/a"
    if spread.get("n", 2) == 1 or spread["min"] == spread["max"]:
        return f"{spread['median']:.{digits}f}"
    return (f"{spread['median']:.{digits}f} [{spread['min']:.{digits}f}.."
            f"{spread['max']:.{digits}f}]")


def _of(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values),
            "n": len(values)}


def _machine(report: dict[str, Any]) -> list[str]:
    m = report["machine"]
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v)
    missing = ", ".join(k for k, v in m["versions"].items() if not v)
    load = " / ".join(f"{x:.1f}" for x in m["load_average"])
    end = " / ".join(f"{x:.1f}" for x in m.get("load_average_end", ()))
    return [
        "# swactor benchmark report", "",
        f"Written by `just bench` (`python -m bench report`) on {m['date_utc']} UTC in "
        f"{report['seconds'] / 60:.1f} min; commit {m['swactor_commit']}"
        f"{' (working tree modified)' if m['working_tree_modified'] else ''}.", "",
        f"- machine: {m['cpu']}, {m['cpus']} CPUs, {m['memory_gib']:.0f} GiB, "
        f"Linux {m['kernel']}; no GPU (tinygrad on CPU, clang)",
        f"- load average (1/5/15 min) at start {load}, at end {end}: the machine is shared "
        "with other jobs, so every ratio below pairs figures taken side by side in this run",
        f"- Python {m['python']}; {versions}" + (f"; not installed: {missing}" if missing
                                                  else ""),
        "- each figure: median [min..max] over the repeats named beside it",
        *(f"- note: {note}" for note in report.get("notes", [])), "",
    ]


def _goals(report: dict[str, Any]) -> list[str]:
    lines = ["## Goals", "", "| goal | measured | target | verdict | measured by |",
             "|---|---|---|---|---|"]
    for row in report["goals"]:
        measured = _spread(row["measured"], 3)
        if row["measured"]:
            measured += f" (n={row['measured']['n']})"
        note = f"; {row['note']}" if row["note"] else ""
        lines.append(f"| {row['goal']} | {measured} | {row['direction']} {row['target']:g} | "
                     f"{row['verdict']} | {row['source']}{note} |")
    return [*lines, ""]


def _median_of(runs: list[dict[str, Any]], stage: int, column: str) -> float:
    return float(statistics.median(r["per_stage_ms"][stage][column] for r in runs
                                   if len(r["per_stage_ms"]) > stage))


def _breakdown(title: str, runs: list[dict[str, Any]]) -> list[str]:
    if not runs:
        return []
    stages = len(runs[0]["per_stage_ms"])
    period = statistics.median(r["token_period_ms"]["median"] for r in runs
                               if r["token_period_ms"])
    lines = [f"**{title}** ({len(runs)} run(s); token period {period:.1f} ms)", "",
             "| stage | compute | ring copies (est.) | QUIC + pumps | control | waiting | "
             "object bytes |", "|---|---|---|---|---|---|---|"]
    for stage in range(stages):
        cells = " | ".join(f"{_median_of(runs, stage, c):.2f}" for c in COLUMNS)
        extent = _median_of(runs, stage, "extent_bytes")
        lines.append(f"| {stage} | {cells} | {extent:.0f} |")
    return [*lines, ""]


def _cpu_rows(runs: list[dict[str, Any]]) -> list[str]:
    samples = [r["cpu"] for r in runs if r.get("cpu")]
    if not samples:
        return []
    keys = [(p["role"], p["stage"]) for p in samples[0]["processes"]]
    cells = []
    for role, stage in keys:
        values = [p["cpu_ms_per_token"] for cpu in samples for p in cpu["processes"]
                  if (p["role"], p["stage"]) == (role, stage)]
        name = role if stage is None else f"{role} {stage}"
        cells.append(f"{name} {statistics.median(values):.1f}")
    return ["CPU ms per token by process (median over runs): " + ", ".join(cells) + ".", ""]


def _e2e(e2e: dict[str, Any]) -> list[str]:
    if not e2e:
        return ["## End to end", "", "Not run (--skip e2e).", ""]
    lines = [
        "## End to end: SmolLM2-135M Q4_1, CPU, greedy, "
        f"{e2e['tokens']} new tokens after \"{e2e['prompt']}\"", "",
        "Each stage is its own `swactor node` process with its own worker process "
        "(`swactor run --nodes N`); runs interleaved 1, 2, 3, 1, 2, 3, ... "
        f"({e2e['repeat']} per stage count).", "",
        "| stages | network | time to first token s | decode tok/s (session) | "
        "decode tok/s (steady) | CPU ms per token (all processes) | pool ready -> barrier s "
        "| runs |", "|---|---|---|---|---|---|---|---|"]
    for count, summary in e2e["summary"].items():
        runs = e2e["runs"][count]
        barrier = [r["bring_up"]["pool_ready_to_barrier_s"] for r in runs]
        lines.append(
            f"| {count} | loopback | {_spread(summary['ttft_s'])} | "
            f"{_spread(summary['session_tokens_per_s'])} | "
            f"{_spread(summary['steady_tokens_per_s'])} | "
            f"{_spread(summary.get('cpu_ms_per_token'), 1)} | "
            f"{statistics.median(barrier):.1f} | {len(runs)} |" if runs else
            f"| {count} | loopback | failed | | | | | 0 |")
    netns = e2e.get("netns")
    if isinstance(netns, dict):
        lines.append(f"| 3 | netns (4 namespaces, one bridge) | {netns['ttft_s']:.2f} | "
                     f"{netns['session_tokens_per_s']:.2f} | "
                     f"{netns['steady_tokens_per_s']:.2f} | not sampled | "
                     f"{netns['bring_up']['pool_ready_to_barrier_s']:.1f} | 1 |")
    else:
        lines.append(f"| 3 | netns | {netns} | | | | | 0 |")
    ratio = e2e.get("ratio_3_to_1") or {}
    lines += [
        "",
        f"3-stage / 1-stage decode rate, runs of the same repeat paired: steady "
        f"{_spread(ratio.get('steady_tokens_per_s'), 3)}, session "
        f"{_spread(ratio.get('session_tokens_per_s'), 3)}; CPU basis (1-stage CPU ms per "
        f"token / 3-stage's: the rate ratio if CPU were the only limit) "
        f"{_spread(ratio.get('cpu_ms_per_token'), 3)}.", "",
        "- *CPU ms per token*: user + system CPU time of every process of the run (the "
        "`swactor run` process with the orchestrator, each node, each worker) from token "
        f"{e2e['warmup_tokens'] + 2} to token {e2e['tokens'] - 3}, over the tokens received "
        "meanwhile; it moves little with the machine's load, unlike wall time.",
        "- *time to first token*: from the readiness barrier (prompt injected) to the first "
        "token; it includes tinygrad compiling the prefill kernels of every stage.",
        "- *session* rate: (tokens - 1) / (last token - first token), the figure "
        "`swactor run` prints; it includes compiling the decode kernels on the first "
        f"decode steps. *steady*: decode tokens after the first {e2e['warmup_tokens']}, "
        "from the orchestrator's token_received timestamps.", "",
    ]
    for error in e2e["errors"]:
        lines.append(f"- run error: {error}")
    return lines


def _time_split(e2e: dict[str, Any]) -> list[str]:
    if not e2e:
        return []
    ring = e2e.get("ring_gbps_for_split") or 0.0
    lines = [
        "## Where a decode token's time goes, per stage", "",
        "Milliseconds per steady decode token (median per run, then median over runs), "
        "from the lifecycle events' timestamps (one monotonic clock on this machine): "
        "*compute* = execute_step_started -> step_completed (the worker's step, its egress "
        "ring write and the JSON-line round trip); *ring copies* + *QUIC + pumps* = the "
        "upstream's object_produced (stage 0: the orchestrator's previous token_received) "
        "-> this stage's object_loaded, of which ring copies are estimated as 4 copies of the "
        f"object's bytes at the ring rate measured in this report ({ring:.2f} GB/s) and the "
        "rest is QUIC, both pumps and the event reports; *control* = object_loaded -> "
        "execute_step_started (StageController dispatch); *waiting* = the rest of the token "
        "period, while other stages and the orchestrator work (it holds the last stage's hop "
        "back to the orchestrator too). Each row sums to the token period.", ""]
    for count, runs in e2e["runs"].items():
        lines += _breakdown(f"{count} stage(s), loopback", runs)
        lines += _cpu_rows(runs)
    netns = e2e.get("netns")
    if isinstance(netns, dict):
        lines += _breakdown("3 stages, netns", [netns])
    return lines


def _bring_up(e2e: dict[str, Any]) -> list[str]:
    runs = e2e.get("runs", {}).get("3") if e2e else None
    if not runs:
        return []
    lines = ["## Bring-up (3 stages, loopback)", "",
             f"Seconds, median [min..max] over {len(runs)} run(s). Node start = the node's "
             "node_started event (its Python imports before that are not counted).", "",
             "| stage | node start -> node_available | pool_ready -> weights downloaded | "
             "-> weights_loaded (role configured) | -> stage_ready |", "|---|---|---|---|---|"]
    for stage in range(len(runs[0]["bring_up"]["stages"])):
        def col(key: str, stage: int = stage) -> str:
            return _spread(_of([r["bring_up"]["stages"][stage][key] for r in runs]))
        lines.append(f"| {stage} | {col('node_start_to_available_s')} | "
                     f"{col('pool_to_downloaded_s')} | {col('pool_to_weights_loaded_s')} | "
                     f"{col('pool_to_stage_ready_s')} |")
    barrier = [r["bring_up"]["pool_ready_to_barrier_s"] for r in runs]
    lines += ["", f"pool_ready -> readiness_barrier_passed (weight load included): "
              f"{_spread(_of(barrier))} s.", ""]
    weights = e2e.get("weights")
    if isinstance(weights, list):
        lines += ["Weight bytes each stage reads (the worker's `load_stage` call replayed "
                  "for the run's layer ranges on a byte-counting source, plus the node's "
                  "header check):", "",
                  "| stage | layers | share (tensor bytes) | worker reads | + node header | "
                  "ratio to share | fraction of file |", "|---|---|---|---|---|---|---|"]
        for w in weights:
            lines.append(f"| {w['stage']} | {w['layers'][0]}-{w['layers'][1] - 1} | "
                         f"{w['share_bytes'] / 1e6:.2f} MB | {w['worker_bytes'] / 1e6:.2f} MB | "
                         f"{w['node_and_worker_bytes'] / 1e6:.2f} MB | "
                         f"{w['worker_ratio']:.3f}x worker, {w['node_and_worker_ratio']:.3f}x "
                         f"both | {w['file_fraction']:.2f} |")
        lines.append("")
    elif weights:
        lines += [f"Weight bytes: {weights}", ""]
    return lines


def _profile(e2e: dict[str, Any]) -> list[str]:
    prof = e2e.get("profile") if e2e else None
    if not prof:
        return []
    if "error" in prof:
        return ["## Profile", "", f"Not taken: {prof['error']}", ""]
    lines = ["## Profile of the hottest path", "",
             f"py-spy, {prof['seconds']:.0f} s at {prof['rate_hz']} Hz, non-blocking, during "
             f"steady decode of a separate 3-stage loopback run: stage {prof['stage']}'s worker "
             "process and its node process. Shares are of the samples in which the process "
             "was running (idle waits are not sampled).", ""]
    for name in ("worker", "node"):
        part = prof.get(name, {})
        if "error" in part:
            lines += [f"{name}: {part['error']}", ""]
            continue
        lines += [f"**{name}** (pid {part.get('pid')}, {part['samples']} samples = "
                  f"{part['samples'] / (prof['seconds'] * prof['rate_hz']):.0%} of the "
                  "window busy). Top five costs by self time:", ""]
        lines += [f"{i}. `{row['function']}` {row['share']:.1%}"
                  for i, row in enumerate(part["self"][:5], 1)]
        lines += ["", "Largest inclusive:", ""]
        lines += [f"- `{row['function']}` {row['share']:.0%}" for row in part["inclusive"][:12]]
        lines.append("")
    return lines


def _limits(report: dict[str, Any]) -> list[str]:
    e2e = report.get("e2e") or {}
    lines = ["## What limits the missed goals", ""]
    one, three = e2e.get("runs", {}).get("1"), e2e.get("runs", {}).get("3")
    if one and three:
        def total(runs: list[dict[str, Any]], column: str) -> float:
            return float(statistics.median(sum(s[column] for s in r["per_stage_ms"])
                                           for r in runs))
        p1 = statistics.median(r["token_period_ms"]["median"] for r in one)
        p3 = statistics.median(r["token_period_ms"]["median"] for r in three)
        parts = {c: total(three, c) - total(one, c) for c in
                 ("compute_ms", "ring_ms", "quic_ms", "control_ms")}
        rest = (p3 - p1) - sum(parts.values())
        lines.append(
            f"- 3 stages vs 1: a steady token takes {p3:.1f} ms against {p1:.1f} ms "
            f"({p3 - p1:+.1f} ms). Of the difference, summed over the stages on a token's "
            f"path: compute {parts['compute_ms']:+.1f} ms, ring copies "
            f"{parts['ring_ms']:+.2f} ms, QUIC + pumps {parts['quic_ms']:+.1f} ms, control "
            f"{parts['control_ms']:+.1f} ms, other (orchestrator, clock of the "
            f"period) {rest:+.1f} ms. Decode is sequential (one token in flight), so every "
            "hop and every stage's fixed per-step cost adds to the token period. These are "
            "wall-clock figures: on this shared machine the compute term moves with other "
            "jobs' load far more than the hops do; the CPU line below is the steadier one.")
    if one and three:
        lines += _cpu_limits(one, three)
    lines += _profile_limits(e2e.get("profile"))
    weights = e2e.get("weights")
    if isinstance(weights, list) and weights:
        header = weights[0]["header_bytes"]
        lines.append(
            f"- Weight bytes: every stage reads the file's header ({header / 1e6:.1f} MB: the "
            "GGUF metadata, tokenizer included) once, in the node's range check, which hands "
            "the worker the stage's tensor table; the worker reads its tensors only. The "
            "tensor table comes after the metadata, so the header cannot be skipped, and "
            "against a stage whose share is small (the middle stage's "
            f"{min(w['share_bytes'] for w in weights) / 1e6:.1f} MB) it alone exceeds 5%.")
    ring = report.get("ring_goal") or {}
    if ring.get("ratio_per_cpu_second"):
        lines.append(
            f"- Ring: wall clock {ring['ratio']['median']:.2f}x memcpy but "
            f"{ring['ratio_per_cpu_second']['median']:.2f}x per CPU-second: a producer and a "
            "consumer process need two cores, and this machine's two are shared, so the wall "
            "figure measures the load as much as the ring.")
    lines += _hotpath_limits(report.get("hotpath_goal"))
    lines += _model_limits(report)
    lines += _coldstart_limits(report.get("coldstart_goal"))
    lines += _serve_limits(report.get("serve_goal"))
    lines += _recovery_limits(report)
    lines.append("")
    return lines


def _missed(report: dict[str, Any], *words: str) -> bool:
    """Whether a goal row whose name holds every one of ``words`` was missed."""
    return any(all(w in row["goal"] for w in words) and row["verdict"].startswith("missed")
               for row in report.get("goals", []))


def _median(rounds: list[dict[str, Any]], path: tuple[str, ...]) -> float:
    values = []
    for row in rounds:
        value: Any = row
        for key in path:
            value = value[key]
        values.append(float(value))
    return float(statistics.median(values))


def _top(profile: dict[str, Any], n: int) -> str:
    return ", ".join(f"`{row['function'].split(' (')[0]}` {row['share']:.0%}"
                     for row in profile.get("self", [])[:n])


def _event_lines_share(profile: dict[str, Any]) -> str:
    """What the node's lifecycle event lines (spec §40) cost among a profile's six
    leading self-time entries, or that they are not among them."""
    rows = [row for row in profile.get("self", [])[:6]
            if any(name in row["function"] for name in ("JsonlSink", "LifecycleEvent"))]
    if not rows:
        return "; no state machine or event line is among them"
    share = sum(float(row["share"]) for row in rows)
    return f"; writing its lifecycle event lines takes {share:.0%} of it"


def _hotpath_limits(figures: dict[str, Any] | None) -> list[str]:
    """G1-G3 from `bench hotpath`: where a token's period goes beyond the model's step."""
    rounds = (figures or {}).get("rounds") or []
    if not rounds:
        return []
    model = _median(rounds, ("model", "step_ms"))
    p1, p3 = _median(rounds, ("one", "period_ms")), _median(rounds, ("three", "period_ms"))
    c1, c3 = _median(rounds, ("one", "compute_ms")), _median(rounds, ("three", "compute_ms"))
    stages = rounds[0]["three"]["per_stage"]
    inbound = statistics.median(
        float(statistics.median(s["inbound_ms"] for s in r["three"]["per_stage"]))
        for r in rounds)
    control = statistics.median(
        float(statistics.median(s["control_ms"] for s in r["three"]["per_stage"]))
        for r in rounds)
    node = _median(rounds, ("three", "node_cpu_ms"))
    orch = _median(rounds, ("one", "orchestrator_cpu_ms"))
    lines = [
        f"- Per-token path (`bench hotpath`, G1-G3): the model alone steps in {model:.1f} ms; "
        f"a 1-stage token period is {p1:.1f} ms (compute {c1:.1f} ms), a 3-stage one "
        f"{p3:.1f} ms (compute summed over the {len(stages)} stages {c3:.1f} ms: each "
        "stage's step has a fixed part, the decode graph's launch and its input/output "
        "copies, that one stage pays once). Per stage, the largest fixed term is the "
        f"inbound hop, {inbound:.2f} ms median (previous stage's or orchestrator's "
        "ObjectProduced to this stage's ObjectLoaded: ring read, QUIC send and receive, two "
        f"event loops waking), then control {control:.2f} ms; the orchestrator spends "
        f"{orch:.1f} ms CPU per token reading it and writing its lifecycle lines, and the "
        f"busiest node {node:.2f} ms (3 stages)."]
    prof = (figures or {}).get("profile") or {}
    if prof.get("node", {}).get("self"):
        lines.append(
            f"- The node's CPU per token (G3): its profile during steady decode is led by "
            f"{_top(prof['node'], 6)} (self time, {prof['node'].get('samples', 0)} samples): "
            "waiting in the event loop, one UDP send per QUIC packet (the object and the "
            "ACKs), the SWIM thread's probes and the doorbell writes to the worker"
            + _event_lines_share(prof["node"])
            + ". Getting under 0.5 ms needs fewer packets and wake-ups per token, not "
            "faster Python in any one place.")
    if prof.get("worker", {}).get("self"):
        lines.append(
            f"- The worker (G1): {_top(prof['worker'], 1)} of its self time: nearly all of "
            "it is the decode step's kernels, so G1's remaining gap is the period's fixed "
            "terms above, not the worker's Python.")
    return lines


def _model_limits(report: dict[str, Any]) -> list[str]:
    """Decode rate against llama.cpp (`bench model`)."""
    if not _missed(report, "llama.cpp decode"):
        return []
    output = next((m["output"] for m in report.get("modules", []) if m["name"] == "model"), "")
    llama = (report.get("model_goal") or {}).get("llama_cpp_tokens_per_s")
    one = re.search(r"on 1 thread / llama\.cpp 1 thread = ([\d.]+)x", output) or re.search(
        r"ours/llama\.cpp 1 thread = ([\d.]+)x", output)
    fastest = re.search(r"fastest: (\S+)", output)
    at = output.find(f"  {fastest.group(1).replace(':', '_')} (") if fastest else -1
    scaling = re.search(r"decode by threads: .*?; (\d+)/1 = ([\d.]+)x", output[max(at, 0):])
    line = (f"- Decode against llama.cpp: llama.cpp decodes {llama:.1f} tok/s on the same "
            "threads. " if llama else "- Decode against llama.cpp: ")
    if scaling:
        line += (f"Our step's kernel slices run on a thread pool, {scaling.group(2)}x one "
                 f"thread's rate on {scaling.group(1)} threads (the fastest variant); ")
    else:
        line += "The decode step's kernels ran on one thread in this run; "
    if one:
        line += f"thread for thread we decode at {float(one.group(1)):.2f}x llama.cpp. "
    line += ("The gap per thread is the kernels: our decode unpacks every Q4_1/Q8_0 block "
             "once for all of a step's rows, on x86-64 into integer dot products on 16-bit "
             "activations (the output projection in f32; a hand-written kernel, "
             "`swactor/model/decode_gemv.py`; the step's other kernels are tinygrad's, with "
             "a barrier between dependent ones), against llama.cpp's integer dot products "
             "on 8-bit activations.")
    return [line]


def _coldstart_limits(figures: dict[str, Any] | None) -> list[str]:
    modes = (figures or {}).get("modes") or {}
    lines = []
    dense, blocks = modes.get("dense"), modes.get("blocks")
    if dense and blocks and dense["warm"]["load_s"] > blocks["warm"]["load_s"]:
        lines.append(
            f"- Cold start, dense weights: pool ready -> barrier {dense['warm']['load_s']:.2f} "
            f"s against {blocks['warm']['load_s']:.2f} s from blocks (the default): dense "
            "widens every quantised block to f16 at load, which blocks never does.")
    for name, mode in modes.items():
        ratio = mode.get("demo_over_single_stage")
        if ratio is not None and ratio < 0.85:
            lines.append(
                f"- Demo [{name}]: the 3-stage second run decodes at "
                f"{mode['warm']['decode_tokens_per_s']:.1f} tok/s (the run's own mean over "
                "its tokens) against the model stepped alone in one process, "
                f"{mode['single_stage_tokens_per_s']:.1f} tok/s ({ratio:.2f}): a token "
                "crosses three stages, each paying the inbound hop and a step's fixed part "
                "(G3 above), and the orchestrator's turn between tokens.")
    return lines


def prefill_bound(one: dict[str, Any], clients: int = 4) -> float | None:
    """The most ``clients`` clients' aggregate can be over one client's on one stage if
    their decode steps batched for free: a request at 1 client spends ``P`` (TTFT p50)
    before its first token and ``D`` (its other tokens at the median decode rate) after;
    ``clients`` requests need ``clients`` prefills on the same cores (a prompt's rows
    already fill them) and at least one request's decode: ``c (P + D) / (c P + D)``."""
    requests, rate = one.get("requests") or 0, one.get("decode_p50_tokens_per_s") or 0.0
    if not requests or rate <= 0 or one.get("ttft_p50_ms") is None:
        return None
    prefill = float(one["ttft_p50_ms"]) / 1000.0
    decode = max(0.0, float(one["tokens"]) / requests - 1.0) / float(rate)
    return clients * (prefill + decode) / (clients * prefill + decode)


def _serve_why(server: str, threads: dict[str, Any] | None,
               one: dict[str, Any] | None = None) -> str:
    """Why a swactor pipeline's 4-client aggregate stops where it does, from the threads
    `bench serve` gave it (None: a run that did not record them) and its 1-client row."""
    if server.endswith("-1"):
        given = f"its {threads['per_node']} thread(s)" if threads else "the threads it has"
        line = (f"One stage has one worker, which computes every step on {given}: 4 "
                "clients time-share them, and only batching several sequences into one "
                "step (`--batch-rows`) can add to it.")
        bound = prefill_bound(one) if one else None
        if bound is not None and one is not None:
            line += (f" Batching adds only to decode: at 1 client a request spends "
                     f"{one['ttft_p50_ms']:.0f} ms before its first token and "
                     f"{one['tokens'] / one['requests'] - 1:.1f} more tokens at "
                     f"{one['decode_p50_tokens_per_s']:.1f} tok/s after it, and 4 "
                     "clients' prompts prefill on the same cores one after another, so "
                     "even a 4-row step that cost no more than one row would give at most "
                     f"{bound:.2f}x (a faster prefill, or longer completions, raise it).")
        return line
    if threads is None:
        return ("Its stages share this machine's CPUs, and one object crosses the stages "
                "one after another, so concurrency alone caps 4 clients near one client's "
                "rate times the stages that compute at once (its objects in flight) before "
                "any fixed cost; beyond that only batching several sequences into one step "
                "adds.")
    return (f"Its stages share this machine's CPUs, {threads['per_node']} thread(s) each, "
            f"{threads['at_once']} computing at once (its objects in flight), and one object "
            "crosses the stages one after another, so concurrency alone caps 4 clients near "
            f"{threads['at_once']}x one client's rate before any fixed cost; beyond that "
            "only batching several sequences into one step adds.")


def _serve_limits(figures: dict[str, Any] | None) -> list[str]:
    levels = (figures or {}).get("levels") or {}
    lines = []
    for server, rows in levels.items():
        if not server.startswith("swactor") or "1" not in rows or "4" not in rows:
            continue
        one, four = rows["1"], rows["4"]
        lines.append(
            f"- Serving [{server}]: aggregate {one['aggregate_tokens_per_s']:.1f} tok/s with "
            f"1 client, {four['aggregate_tokens_per_s']:.1f} with 4 "
            f"({four['aggregate_tokens_per_s'] / max(one['aggregate_tokens_per_s'], 1e-9):.2f}x"
            f"), each request then decoding at {four['decode_p50_tokens_per_s']:.1f} tok/s. "
            + _serve_why(server, ((figures or {}).get("settings", {})
                                  .get("server_threads", {}).get(server)), one))
    llama = levels.get("llama.cpp") or {}
    if "1" in llama and "4" in llama and llama["1"]["aggregate_tokens_per_s"]:
        lines.append(
            f"- For scale: llama.cpp's server at 4 clients serves "
            f"{llama['4']['aggregate_tokens_per_s'] / llama['1']['aggregate_tokens_per_s']:.2f}x "
            "its 1-client aggregate on this machine (it runs one request at a time on the "
            "threads it is given).")
    return lines


def _recovery_limits(report: dict[str, Any]) -> list[str]:
    """A missed recovery goal (`bench.report.recovery_goals`), from its fault kind's
    figures: for the next token, the recovery's phases and the one that dominates (beyond
    the new run's load where the goal excludes it); else the figure against its bound."""
    faults = {row["kind"]: row for row in (report.get("recovery_goal") or {}).get("rows", [])}
    phases = (report.get("recovery_goal") or {}).get("phases", [])
    lines = []
    for row in report.get("goals", []):
        which = row.get("recovery")
        if not which or which["kind"] not in faults or not row["verdict"].startswith("missed"):
            continue
        fault = faults[which["kind"]]
        shown = {name: spread["median"] for name, spread in fault["figures"].items()}
        if which["figure"] == "next_token":
            parts = {name: shown[f"phase_{name}_s"] for name in phases
                     if f"phase_{name}_s" in shown}
            beyond = {name: value for name, value in parts.items()
                      if fault.get("spares") or name != "provision"}
            if not beyond:
                continue
            top = max(beyond, key=lambda name: beyond[name])
            split = ", ".join(f"{name} {value:.2f} s" for name, value in parts.items())
            lines.append(
                f"- Recovery [{fault['label']}]: the kill -> the slowest stream's next token "
                f"{shown.get('next_token_s', 0.0):.2f} s (median), by phase {split}; "
                + (f"{top} dominates ({beyond[top]:.2f} s)." if fault.get("spares") else
                   f"beyond the new run's load (provision), {top} dominates "
                   f"({beyond[top]:.2f} s of {sum(beyond.values()):.2f} s)."))
        elif which["figure"] == "detect":
            lines.append(
                f"- Detection [{fault['label']}]: {shown['detect_s']:.2f} s (median) from the "
                f"fault to run_faulted against its bound {fault['bound_s']:.2f} s "
                f"({fault['bound']}; {', '.join(fault.get('reasons', [])) or 'no reason'}).")
        else:
            lines.append(
                f"- Recovery [{fault['label']}]: {row['measured']['median']:g} token(s) "
                f"{which['figure']} over {row['measured']['n']} trial(s), against the same "
                "prompts served undisturbed.")
    return lines


def _cpu_by_role(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Median over runs of the CPU ms per token summed per role."""
    per_run: dict[str, list[float]] = {}
    for run in runs:
        if not run.get("cpu"):
            continue
        sums: dict[str, float] = {}
        for proc in run["cpu"]["processes"]:
            sums[proc["role"]] = sums.get(proc["role"], 0.0) + proc["cpu_ms_per_token"]
        for role, value in sums.items():
            per_run.setdefault(role, []).append(value)
    return {role: float(statistics.median(v)) for role, v in per_run.items()}


def _cpu_limits(one: list[dict[str, Any]], three: list[dict[str, Any]]) -> list[str]:
    cpu1, cpu3 = _cpu_by_role(one), _cpu_by_role(three)
    if not cpu1 or not cpu3:
        return []
    parts = ", ".join(f"{role} {cpu3.get(role, 0.0) - cpu1.get(role, 0.0):+.1f} ms "
                      f"({cpu1.get(role, 0.0):.1f} -> {cpu3.get(role, 0.0):.1f})"
                      for role in ("worker", "node", "orchestrator"))
    return [f"- In CPU time, which this machine's load hardly moves, a steady token costs "
            f"{sum(cpu3.values()):.1f} ms across all processes with 3 stages against "
            f"{sum(cpu1.values()):.1f} ms with 1: {parts}. Three workers each pay a step's "
            "fixed part (the decode graph's launch, its input and output copies, the step "
            "report to its node), and three nodes each pay a QUIC send and receive, a "
            "doorbell to their worker and their event lines; the model's arithmetic is the "
            "same."]


def _profile_limits(prof: dict[str, Any] | None) -> list[str]:
    if not prof or "error" in prof or "error" in prof.get("worker", {}):
        return []
    top = ", ".join(f"`{row['function'].split(' (')[0]}` {row['share']:.0%}"
                    for row in prof["worker"]["self"][:5])
    return [f"- The e2e run's worker profile (default weights) is led by {top} (self time "
            "while busy): `CpuGraph.replay` is the decode step's kernels; the rest is the "
            "worker's per-step Python around them."]


def _serve(report: dict[str, Any]) -> list[str]:
    from bench.serve import markdown

    figures = report.get("serve_goal")
    return markdown(figures) if figures else []


def _kquant(report: dict[str, Any]) -> list[str]:
    from bench.kquant import markdown

    figures = report.get("kquant")
    return markdown(figures) if figures else []


def _modules(report: dict[str, Any]) -> list[str]:
    lines = ["## Every benchmark's own output", ""]
    for module in report["modules"]:
        args = " ".join(module["args"])
        lines += [f"### {module['name']}" + (f" `{args}`" if args else ""), "",
                  f"exit {module['rc']}, {module['seconds']:.0f} s", "", "```text",
                  module["output"].rstrip(), "```", ""]
    return lines


def render(report: dict[str, Any]) -> str:
    """The whole Markdown report."""
    e2e = report.get("e2e") or {}
    parts = (_machine(report) + _goals(report) + _limits(report) + _e2e(e2e)
             + _time_split(e2e) + _bring_up(e2e) + _profile(e2e) + _serve(report)
             + _kquant(report) + _modules(report))
    return "\n".join(parts).rstrip() + "\n"
