"""The benchmark report: every benchmark, the goal ratios side by side, one Markdown + JSON.

Theory of operation
-------------------
``python -m bench report`` (and ``just bench`` with no name) measures, in one invocation
on one machine, so that every ratio compares figures taken minutes apart under the same
load:

1. the machine, the load, the versions and the commit (`_machine`);
2. the end-to-end figures (`bench.e2e.measure`: 1/2/3 stages on loopback, interleaved,
   ``--e2e-repeat`` runs each; the netns 3-stage run; weight bytes; a py-spy profile);
3. the goal ratios with min / median / max over repeats: ring vs memcpy (interleaved
   in-process calls of `bench.ring`'s own measurements, each repeat a pair), QUIC edge
   vs TCP at 16 KiB datagrams and the hop p50 (`bench.quic --json`, which interleaves its
   own rounds), a single stage vs llama.cpp (parsed from `bench model`'s lines, both
   figures of the same run; llama.cpp only where `just reference` built it), and each
   stage's weight bytes against its share;
4. every other benchmark module, run as a subprocess with its output kept verbatim
   (fewer repeats than their defaults for the slow ones: `MODULE_ARGS`); those in
   `JSON_MODULES` also write their figures as JSON, from which the cold-start, per-token
   path, serving and recovery goal rows come (`coldstart_goals` ... `recovery_goals`).

It writes ``bench/report.json`` (every figure) and ``bench/report.md`` (`_render`) and
prints the goal table. A module that fails is recorded with its exit code and output;
the report is still written, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._lifecycle import Spread

HERE = Path(__file__).resolve().parent
# Arguments for each module's text run: fewer repeats than their defaults where a module
# is slow, so that the whole report stays near half an hour on a busy 2-core machine.
MODULE_ARGS: dict[str, list[str]] = {
    "fsm": ["--repeats", "2"],
    "ring": ["--quick"],
    "quic": ["--repeat", "3"],  # 128 MiB per run: shorter runs are mostly slow-start ramp-up
    "model": ["--tokens", "24", "--dtypes", "f16,f32", "--beam", "0"],
    "batch": ["--steps", "3", "--rounds", "2"],
    "worker": ["--quick"],
    "coldstart": ["--weights", "dense,blocks"],
    "hotpath": ["--repeat", "2", "--profile"],
    "serve": ["--rounds", "2", "--max-tokens", "32", "--long-tokens", "128", "--pairs", "5"],
    "recovery": ["--repeat", "1"],
}
JSON_MODULES = ("quic", "coldstart", "hotpath", "serve", "kquant", "recovery")  # with --json
NOT_TEXT = {"report", "e2e"}  # e2e is measured in process, report is this module
RING_TOTAL_MIB = 512
MODULE_TIMEOUT_S = 900


def run_module(name: str, args: list[str], echo: bool = True) -> dict[str, Any]:
    """`bench.<name>.main(args)` in a subprocess; its output, exit code and wall time."""
    code = f"import sys, bench.{name} as m; sys.exit(m.main(sys.argv[1:]))"
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-c", code, *args], cwd=HERE.parent,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    lines: list[str] = []
    deadline = started + MODULE_TIMEOUT_S
    for line in process.stdout:
        lines.append(line)
        if echo:
            print(f"  {line}", end="", flush=True)
        if time.monotonic() > deadline:
            process.kill()
            lines.append(f"(killed after {MODULE_TIMEOUT_S}s)\n")
            break
    rc = process.wait()
    return {"name": name, "args": args, "rc": rc, "seconds": time.monotonic() - started,
            "output": "".join(lines)}


# -- goals ---------------------------------------------------------------------------------


def verdict(measured: float, target: float, at_least: bool) -> str:
    """'met', or 'missed: N% short of / over the target'."""
    if (measured >= target) if at_least else (measured < target):
        return "met"
    if at_least:
        return f"missed by {(target - measured) / target:.0%} ({measured:.3g} vs >= {target:g})"
    return f"missed by {(measured - target) / target:.0%} over ({measured:.3g} vs < {target:g})"


def goal(name: str, spread: dict[str, float] | None, target: float, at_least: bool,
         source: str, note: str = "") -> dict[str, Any]:
    row: dict[str, Any] = {"goal": name, "target": target,
                           "direction": ">=" if at_least else "<", "measured": spread,
                           "source": source, "note": note}
    row["verdict"] = (verdict(spread["median"], target, at_least) if spread
                      else "not measured")
    return row


def ring_vs_memcpy(repeat: int, total_mib: int) -> dict[str, Any]:
    """memcpy and ring GB/s, interleaved in pairs; the ratio of each pair."""
    from bench import ring
    from swactor.ring import VERSION_SPLIT

    total = total_mib * ring.MiB
    memcpy, through, ratios, cpu_ratios = [], [], [], []
    for _ in range(repeat):
        copy_gbps, copy_cpu = ring.memcpy_gbps(total)
        ring_gbps, ring_cpu = ring.ring_gbps(total, VERSION_SPLIT)
        memcpy.append(copy_gbps)
        through.append(ring_gbps)
        ratios.append(ring_gbps / copy_gbps)
        cpu_ratios.append(ring_cpu / copy_cpu)
    return {"total_mib": total_mib, "memcpy_gbps": Spread.of(memcpy).to_json(),
            "ring_gbps": Spread.of(through).to_json(), "ratio": Spread.of(ratios).to_json(),
            "ratio_per_cpu_second": Spread.of(cpu_ratios).to_json()}


_MODEL_DECODE = re.compile(r"^\s*(\w+) \(beam \d+\):.*?decode\s+([\d.]+) tok/s median", re.M)
_LLAMA_DECODE = re.compile(r"llama\.cpp decode ([\d.]+) tok/s")
_LLAMA_PREFILL = re.compile(r"llama\.cpp prefill \d+ tokens [\d.]+ tok/s.*?= ([\d.]+)x")


def model_figures(output: str) -> dict[str, Any]:
    """Single-stage decode tok/s per dtype and llama.cpp's, and the warm prefill ratio to
    llama.cpp's, from `bench model` lines."""
    ours = {dtype: float(rate) for dtype, rate in _MODEL_DECODE.findall(output)}
    llama = _LLAMA_DECODE.search(output)
    prefill = _LLAMA_PREFILL.search(output)
    return {"ours_tokens_per_s": ours,
            "llama_cpp_tokens_per_s": float(llama.group(1)) if llama else None,
            "prefill_over_llama_cpp": float(prefill.group(1)) if prefill else None}


def _one(value: float | None) -> dict[str, float] | None:
    return None if value is None else {"min": value, "median": value, "max": value, "n": 1}


def goals(e2e: dict[str, Any], ring_fig: dict[str, Any] | None, quic: dict[str, Any] | None,
          model: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    ratio = (e2e.get("ratio_3_to_1") or {}).get("steady_tokens_per_s")
    rows.append(goal("3-stage / 1-stage decode tok/s (loopback, steady)", ratio, 0.9, True,
                     "e2e, runs paired by repeat"))
    cpu = (e2e.get("ratio_3_to_1") or {}).get("cpu_ms_per_token")
    rows.append(goal("same, CPU basis: 1-stage / 3-stage CPU ms per token (all processes)",
                     cpu, 0.9, True, "e2e, /proc CPU times during steady decode",
                     "load-insensitive view of the same overhead"))
    rows.append(goal("ring / memcpy throughput", ring_fig["ratio"] if ring_fig else None,
                     0.7, True, f"bench.ring functions, {RING_TOTAL_MIB} MiB, pairs"))
    rows.append(goal("same, per CPU-second (bytes / CPU s of the busier ring side vs memcpy's)",
                     ring_fig["ratio_per_cpu_second"] if ring_fig else None, 0.7, True,
                     "same pairs", "the rate with a core to itself, whatever else runs"))
    rounds = (quic or {}).get("repeat")
    throughput = {name: {k: {**v, "n": rounds} for k, v in row.items()}
                  for name, row in (quic or {}).get("throughput", {}).items()}
    edge = throughput.get("quic 16383 pacing on", {}).get("ratio_wall")
    rows.append(goal("QUIC edge / TCP at 16 KiB datagrams (16383 B, pacing on)", edge, 0.25,
                     True, "bench quic --json, rounds interleaved"))
    edge_cpu = throughput.get("quic 16383 pacing on", {}).get("ratio_cpu")
    rows.append(goal("same, per CPU-second of the busier process", edge_cpu, 0.25, True,
                     "bench quic --json", "less sensitive to other load"))
    hop = (quic or {}).get("hop", {}).get("pacing on", {}).get("p50_ms")
    hop = {**hop, "n": rounds} if hop else None
    rows.append(goal("hop p50 ms (2304 B record, ring->QUIC->ring)", hop, 1.0, False,
                     "bench quic --json"))
    ours = max(model["ours_tokens_per_s"].values(), default=None)
    llama = model["llama_cpp_tokens_per_s"]
    rows.append(goal("single stage / llama.cpp decode (same file, threads)",
                     _one(ours / llama) if ours and llama else None, 0.8, True,
                     "bench model (both in one run)",
                     "" if llama else "llama.cpp not built here (`just reference` builds it)"))
    prefill = model.get("prefill_over_llama_cpp")
    rows.append(goal("single stage / llama.cpp warm prefill, 64-token prompt (same threads)",
                     _one(prefill), 0.5, True, "bench model (both in one run)",
                     "" if prefill else "llama.cpp not built here (`just reference` builds it)"))
    weights = e2e.get("weights")
    if isinstance(weights, list) and weights:
        worst = max(weights, key=lambda w: float(w["node_and_worker_ratio"]))
        rows.append(goal("weight bytes read / stage share (worst stage, node + worker)",
                         _one(float(worst["node_and_worker_ratio"])), 1.05, False,
                         "replay of the worker's load call", f"stage {worst['stage']}"))
    else:
        rows.append(goal("weight bytes read / stage share", None, 1.05, False, "e2e",
                         str(weights)))
    return rows


def coldstart_goals(figures: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Cold-start goal rows from `bench coldstart --json`: tokenize time, and per weight
    mode the first token after the barrier (warm cache, first run ever), pool ready to the
    barrier and the second run's decode over the single stage's."""
    from bench.coldstart import GOALS

    if not figures:
        return [goal("cold start (bench coldstart)", None, 0, False, "bench coldstart")]
    source = f"bench coldstart --json ({figures.get('nodes')} nodes)"
    rows = [goal("swactor tokenize, whole command (s wall)", _one(figures.get("tokenize_s")),
                 GOALS["tokenize_s"], False, source,
                 f"CPU {figures.get('tokenize_cpu_s')} s (user + system)")]
    for weights, mode in figures.get("modes", {}).items():
        cold, warm = mode["cold"], mode["warm"]
        rows += [
            goal(f"first token after the barrier, warm kernel cache (s) [{weights}]",
                 _one(warm.get("first_token_s")), GOALS["warm_first_token_s"], False, source),
            goal(f"first token after the barrier, first run ever (s) [{weights}]",
                 _one(cold.get("first_token_s")), GOALS["cold_first_token_s"], False, source,
                 f"pool ready -> barrier {cold.get('load_s')} s: the kernel build is inside"),
            goal(f"pool ready -> barrier, warm kernel cache (s) [{weights}]",
                 _one(warm.get("load_s")), GOALS["warm_load_s"], False, source),
            goal(f"second run decode / single stage, same weights [{weights}]",
                 _one(mode.get("demo_over_single_stage")), GOALS["demo_over_single_stage"],
                 True, source),
        ]
    return rows


def hotpath_goals(figures: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Per-token-path goal rows from `bench hotpath --json`: one stage against the model
    alone, three stages against one, the fixed cost per stage and the node's CPU per
    token, each wall and CPU basis, rounds measured side by side."""
    if not figures:
        return [goal("per-token path (bench hotpath)", None, 0, False, "bench hotpath")]
    source = (f"bench hotpath --json ({figures.get('weights')} weights, "
              f"{len(figures.get('rounds', []))} rounds)")
    return [goal(row["goal"], row["measured"], row["target"], row["at_least"], source)
            for row in figures.get("goals", [])]


def serve_goals(figures: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Serving goal rows from `bench serve --json`: each figure a ratio of two measured in
    that run (rows with no target, like the TTFT ratio, stay in the serving section)."""
    if not figures:
        return [goal("serving (bench serve)", None, 0, False, "bench serve")]
    return [goal(row["goal"], _one(row["measured"]), row["target"], row["at_least"],
                 "bench serve --json, servers side by side")
            for row in figures.get("goals", []) if row["target"] is not None]


RECOVERY_BEYOND_LOAD_S = 1.0
"""Node kill -> next token of each migrated stream, beyond the new run's load (no spare)."""
RECOVERY_WARM_SPARE_S = 2.0
"""Node kill -> next token of each migrated stream, in all, with a warm spare."""


def _spread_of(values: list[float]) -> dict[str, float] | None:
    return Spread.of(values).to_json() if values else None


def recovery_goals(figures: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Recovery goal rows from `bench recovery --json`. Per serving row (`spares` set)
    of a node kill (`fault`): the kill -> the next token of each migrated stream (its
    slowest) within 1 s plus the new run's load, which is the provision phase (so,
    without a warm spare, each trial's next token minus its provision phase against 1 s)
    and within 2 s in all with a warm spare; the issue states no next-token target for
    the other serving faults (a worker killed past its budget, a link down), whose note
    gives the figure. Per serving row: the tokens lost and duplicated against the
    undisturbed streams, summed over the trials (< 1: none). Per fault kind whose bound
    is a number (`bound_s`): fault -> detection against it. Each row's `recovery` names
    its kind and figure, which `_render._recovery_limits` reads to explain a miss."""
    if not figures:
        return [goal("recovery (bench recovery)", None, 0, False, "bench recovery")]
    source = (f"bench recovery --json ({figures.get('stages')} stages, "
              f"{figures.get('serve_streams')} streams)")
    rows: list[dict[str, Any]] = []

    def add(row: dict[str, Any], kind: str, figure: str) -> None:
        row["recovery"] = {"kind": kind, "figure": figure}
        rows.append(row)

    for fault in figures.get("rows", []):
        kind, trials, shown = fault["kind"], fault["trials"], fault["figures"]
        failed = fault.get("note") or ""
        if fault.get("spares") is not None:
            spare = "warm spare" if fault["spares"] else "cold spare"
            preloaded = shown.get("spare_preloaded")
            if preloaded and preloaded["min"] < (figures.get("stages") or 0):
                spare = f"spare warm for {preloaded['min']:g} of {figures.get('stages')} stages"
            words = fault.get("fault") or "node kill"
            kill = words == "node kill"
            tag = f"[swactor serve, {spare}]" if kill else f"[swactor serve, {words}, {spare}]"
            load, reused = shown.get("phase_provision_s"), shown.get("stages_reused")
            after = shown.get("next_token_s") if not (kill and fault["spares"]) else None
            note = "; ".join(filter(None, [
                load and f"the new run's load (provision phase) {load['median']:.2f} s",
                after and f"{words} -> next token {after['median']:.2f} s",
                reused and f"{reused['median']:g} of {figures.get('stages')} stages reused",
                failed]))
            if kill and fault["spares"]:
                add(goal(f"node kill -> next token of each migrated stream (s) {tag}",
                         shown.get("next_token_s"), RECOVERY_WARM_SPARE_S, False, source,
                         note), kind, "next_token")
            elif kill:
                beyond = [t["extra"]["next_token_s"] - t["extra"]["phase_provision_s"]
                          for t in trials
                          if {"next_token_s", "phase_provision_s"} <= t["extra"].keys()]
                add(goal(f"node kill -> next token of each migrated stream - the new run's "
                         f"load (s) {tag}", _spread_of(beyond), RECOVERY_BEYOND_LOAD_S, False,
                         source, note), kind, "next_token")
            for count in ("lost", "duplicated"):
                counted = [t["extra"][count] for t in trials if count in t["extra"]]
                total = _spread_of([sum(counted)] * len(counted))
                add(goal(f"tokens {count} over every migrated stream {tag}", total, 1, False,
                         source, "; ".join(filter(None, [
                             "summed over the trials, must be 0",
                             failed if kill else note]))), kind, count)
        if fault.get("bound_s") is not None:
            add(goal(f"fault -> detection (s) [{fault['label']}]", shown.get("detect_s"),
                     fault["bound_s"], False, source,
                     "; ".join(filter(None, [fault["bound"], *fault.get("reasons", []),
                                             failed]))), kind, "detect")
    return rows


def _reference_llama_version() -> str | None:
    from bench.model import reference_venv

    python = reference_venv() / "bin" / "python"
    if not python.exists():
        return None
    result = subprocess.run([str(python), "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                            capture_output=True, text=True, timeout=60)
    return result.stdout.strip() or None if result.returncode == 0 else None


# -- main ----------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    from bench.__main__ import available
    from bench._machine import machine
    from bench._render import render
    from bench.e2e import measure, print_figures

    parser = argparse.ArgumentParser(prog="python -m bench report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--e2e-repeat", type=int, default=2, help="e2e runs per stage count")
    parser.add_argument("--ring-repeat", type=int, default=5)
    parser.add_argument("--skip", default="", help="comma-separated modules to leave out")
    parser.add_argument("--out", type=Path, default=HERE, help="where report.md/json go")
    args = parser.parse_args(argv)
    skip = {s for s in args.skip.split(",") if s}
    started = time.monotonic()
    report: dict[str, Any] = {"machine": machine(), "modules": [], "notes": []}
    report["machine"]["versions"]["llama_cpp_python (reference venv)"] = (
        _reference_llama_version())
    status = 0

    ring_fig = None
    if "ring" not in skip:
        print(f"== ring vs memcpy ({args.ring_repeat} pairs) ==", flush=True)
        ring_fig = ring_vs_memcpy(args.ring_repeat, RING_TOTAL_MIB)
        print(f"  ratio {ring_fig['ratio']}", flush=True)
    report["ring_goal"] = ring_fig

    e2e: dict[str, Any] = {}
    if "e2e" not in skip:
        print("== e2e ==", flush=True)
        e2e = measure(repeat=args.e2e_repeat,
                      ring_gbps=ring_fig["ring_gbps"]["median"] if ring_fig else 0.0)
        print_figures(e2e)
        status |= int(bool(e2e["errors"]))
    report["e2e"] = e2e

    quic = None
    coldstart: dict[str, Any] | None = None
    hotpath: dict[str, Any] | None = None
    serve: dict[str, Any] | None = None
    recovery: dict[str, Any] | None = None
    model: dict[str, Any] = {"ours_tokens_per_s": {}, "llama_cpp_tokens_per_s": None,
                             "prefill_over_llama_cpp": None}
    for name in available():
        if name in NOT_TEXT or name in skip:
            continue
        print(f"== {name} ==", flush=True)
        extra = list(MODULE_ARGS.get(name, []))
        with tempfile.TemporaryDirectory() as tmp:
            if name in JSON_MODULES:
                extra += ["--json", f"{tmp}/{name}.json"]
            result = run_module(name, extra)
            if name == "quic" and Path(f"{tmp}/quic.json").exists():
                quic = json.loads(Path(f"{tmp}/quic.json").read_text())
            if name == "coldstart" and Path(f"{tmp}/coldstart.json").exists():
                coldstart = json.loads(Path(f"{tmp}/coldstart.json").read_text())
            if name == "hotpath" and Path(f"{tmp}/hotpath.json").exists():
                hotpath = json.loads(Path(f"{tmp}/hotpath.json").read_text())
            if name == "serve" and Path(f"{tmp}/serve.json").exists():
                serve = json.loads(Path(f"{tmp}/serve.json").read_text())
            if name == "recovery" and Path(f"{tmp}/recovery.json").exists():
                recovery = json.loads(Path(f"{tmp}/recovery.json").read_text())
            if name == "kquant" and Path(f"{tmp}/kquant.json").exists():
                report["kquant"] = json.loads(Path(f"{tmp}/kquant.json").read_text())
        if name == "model":
            model = model_figures(result["output"])
        if name in JSON_MODULES:
            result["args"] = result["args"][:-2]  # the temporary --json path
        report["modules"].append(result)
        status |= int(result["rc"] != 0)
    report["quic_goal"] = quic
    report["model_goal"] = model
    report["coldstart_goal"] = coldstart
    report["hotpath_goal"] = hotpath
    report["serve_goal"] = serve
    report["recovery_goal"] = recovery
    report["goals"] = (goals(e2e, ring_fig, quic, model) + coldstart_goals(coldstart)
                       + hotpath_goals(hotpath) + serve_goals(serve)
                       + recovery_goals(recovery))
    report["machine"]["load_average_end"] = os.getloadavg()
    report["seconds"] = time.monotonic() - started

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "report.md").write_text(render(report))
    print("== goals ==")
    for row in report["goals"]:
        measured = row["measured"]
        shown = f"{measured['median']:.3g}" if measured else "n/a"
        print(f"  {row['goal']}: {shown} -> {row['verdict']}")
    print(f"wrote {args.out / 'report.md'} and report.json in {report['seconds'] / 60:.1f} min")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
