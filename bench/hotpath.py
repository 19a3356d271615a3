"""The per-token path: a token's cost outside the model, 1 stage against 3, side by side.

Theory of operation
-------------------
One invocation, ``--repeat`` rounds, each round three measurements next to each other so
that the machine's load falls on all of them alike:

1. **The model alone.** One role over every block in this process (the weight mode and
   dtype a run uses), warmed up, then ``--tokens`` greedy decode steps: the median step
   (wall) and the CPU time per step.
2. **One stage end to end.** ``swactor run --nodes 1`` (node, worker, orchestrator, QUIC on
   loopback, rings, doorbells): the steady token period (orchestrator ``token_received``
   gaps after the warm-up tokens), each process's CPU per token (`_cputime`) and, from
   the lifecycle events, each stage's compute (``execute_step_started`` ->
   ``step_completed``: the worker's step and its egress write).
3. **Three stages end to end.** ``swactor run --nodes 3``, the same figures.

Goals (the report's rows G1-G3), each as a ratio of figures of the same round:

- G1: one stage end to end decodes at >= 0.9x the model alone (model step / token period;
  CPU basis: model CPU per step / all processes' CPU per token);
- G2: three stages / one stage steady decode >= 0.95 (1-stage period / 3-stage period;
  CPU basis: 1-stage CPU per token / 3-stage's);
- G3: the fixed cost per stage on a token's path <= 0.3 ms: (token period - the stages'
  compute) / stages, wall; CPU basis: (all processes' CPU per token - the model's) /
  stages; and the node process's CPU per token <= 0.5 ms (the busiest node), also shown
  for the node's main thread alone, where the token path runs: the node's SWIM thread
  probes the pool every half second whatever the token rate, so on a CPU decode of
  100-300 ms per token its share of the process figure is ~1 ms per token that no
  change to the token path can remove (`_cputime`).

``--threads N`` runs every measurement with the step's sliced kernels on N threads (the
model alone through `cpu_graph.set_threads`, the runs through ``swactor run --threads``;
default: the nodes' default, the CPU count).

``--datagrams`` adds one more 1-stage and 3-stage run each, with ``strace -c`` on the
main thread of the orchestrator and of every node during the steady tokens: UDP send
calls per token (one datagram each on the token path; `_sendcount`). Those runs are
slowed by the tracing and give no timing.

Wall figures on a shared machine move with other jobs' load; the CPU figures hardly do,
so both are printed. ``--profile`` adds a py-spy profile of the 1-stage node and worker
during steady decode (what limits a missed goal). ``--json PATH`` writes every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

GOALS = {"e2e_over_model": 0.9, "three_over_one": 0.95, "fixed_ms_per_stage": 0.3,
         "node_cpu_ms_per_token": 0.5}
WARMUP = 3


def model_step(weights: str, dtype: str, tokens: int, threads: int | None = None
               ) -> dict[str, float]:
    """The model alone: median decode step (ms) and CPU ms per step, one role, all blocks."""
    import numpy as np

    from swactor.model import cpu_graph
    from swactor.model.gguf_range import open_reader
    from swactor.model.llama_role import StageRole
    from swactor.model.paths import default_model_path
    from swactor.model.tokenizer import Tokenizer

    blocks = weights == "blocks"
    reader = open_reader(default_model_path())
    stage = reader.load_stage(0, reader.facts.block_count, is_first=True, is_last=True,
                              dtype=dtype, keep_blocks=blocks)
    role = StageRole(stage, max_seq_len=512, quantised=blocks)
    del stage
    cpu_graph.set_threads(threads or cpu_graph.cpu_count())
    role.warm_up()
    ids = Tokenizer.from_gguf(default_model_path()).encode("hello world")
    out = role.step(0, np.array(ids, dtype=np.int32))
    steps: list[float] = []
    cpu = 0.0
    for sequence in range(1, tokens + 1):
        started, cpu_started = time.perf_counter(), time.process_time()
        out = role.step(sequence, out)
        steps.append(time.perf_counter() - started)
        if sequence > WARMUP:
            cpu += time.process_time() - cpu_started
    return {"step_ms": 1e3 * statistics.median(steps[WARMUP:]),
            "cpu_ms": 1e3 * cpu / max(1, tokens - WARMUP)}


def _run_flags(weights: str, threads: int | None) -> list[str]:
    return ["--weights", weights, *([] if threads is None else ["--threads", str(threads)])]


@contextlib.contextmanager
def _run_with(weights: str, threads: int | None) -> Iterator[None]:
    """While inside, `bench.e2e`'s `swactor run` commands carry `--weights weights` (and
    `--threads`, if given)."""
    import bench.e2e as e2e

    original = e2e._swactor

    def with_weights(*args: str) -> list[str]:
        argv = list(args)
        if argv and argv[0] == "run":
            argv[1:1] = _run_flags(weights, threads)
        return original(*argv)

    e2e._swactor = with_weights
    try:
        yield
    finally:
        e2e._swactor = original


def e2e_run(stages: int, weights: str, tokens: int, root: Path, threads: int | None = None
            ) -> dict[str, Any]:
    """`swactor run --nodes stages --weights weights [--threads N]`: period, CPU per
    process, compute."""
    import bench.e2e as e2e
    from bench._cputime import CpuSampler

    sampler = CpuSampler(WARMUP + 2, tokens - 3)
    with _run_with(weights, threads):
        run = e2e.run_loopback(stages, tokens, root, sampler)
    figures = e2e.run_figures(run, WARMUP, 0.0, sampler.result)
    cpu = figures["cpu"] or {}
    processes = cpu.get("processes", [])
    period = (figures["token_period_ms"] or {}).get("median")
    compute = sum(s["compute_ms"] for s in figures["per_stage_ms"])
    return {
        "stages": stages, "period_ms": period, "compute_ms": compute,
        "per_stage": figures["per_stage_ms"],
        "cpu_ms_per_token": figures["cpu_ms_per_token"],
        "node_cpu_ms": max((p["cpu_ms_per_token"] for p in processes if p["role"] == "node"),
                           default=None),
        "node_main_cpu_ms": max((p.get("main_thread_cpu_ms_per_token") or 0.0
                                 for p in processes if p["role"] == "node"), default=None),
        "worker_cpu_ms": sum(p["cpu_ms_per_token"] for p in processes if p["role"] == "worker"),
        "orchestrator_cpu_ms": sum(p["cpu_ms_per_token"] for p in processes
                                   if p["role"] == "orchestrator"),
        "tokens": figures["generated_token_ids"],
    }


def send_counts(stages: int, weights: str, tokens: int, root: Path,
                threads: int | None = None) -> dict[str, Any] | str:
    """UDP send calls per steady token of each process's main thread (`_sendcount`), or
    why they could not be counted."""
    import bench.e2e as e2e
    from bench import _sendcount

    missing = _sendcount.available()
    if missing is not None:
        return missing
    counter = _sendcount.SendCounter(WARMUP + 2, tokens - 3)
    with _run_with(weights, threads):
        e2e.run_loopback(stages, tokens, root, counter)
    return counter.result or "no tokens in the counting window"


def round_figures(model: dict[str, float], one: dict[str, Any], three: dict[str, Any]
                  ) -> dict[str, float | None]:
    """The goal ratios of one round (module doc)."""
    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    def fixed(run: dict[str, Any]) -> float | None:
        period = run["period_ms"]
        return (period - run["compute_ms"]) / run["stages"] if period else None

    def fixed_cpu(run: dict[str, Any]) -> float | None:
        total = run["cpu_ms_per_token"]
        return (total - model["cpu_ms"]) / run["stages"] if total else None

    return {
        "e2e_over_model": ratio(model["step_ms"], one["period_ms"]),
        "e2e_over_model_cpu": ratio(model["cpu_ms"], one["cpu_ms_per_token"]),
        "three_over_one": ratio(one["period_ms"], three["period_ms"]),
        "three_over_one_cpu": ratio(one["cpu_ms_per_token"], three["cpu_ms_per_token"]),
        "fixed_ms_per_stage_1": fixed(one),
        "fixed_ms_per_stage_3": fixed(three),
        "fixed_cpu_ms_per_stage_1": fixed_cpu(one),
        "fixed_cpu_ms_per_stage_3": fixed_cpu(three),
        "node_cpu_ms_per_token": max(one["node_cpu_ms"] or 0.0, three["node_cpu_ms"] or 0.0),
        "node_main_cpu_ms_per_token": max(
            (run["node_main_cpu_ms"] for run in (one, three) if run.get("node_main_cpu_ms")),
            default=None),
    }


def spread(values: list[float | None]) -> dict[str, float] | None:
    found = [v for v in values if v is not None]
    if not found:
        return None
    return {"min": min(found), "median": statistics.median(found), "max": max(found),
            "n": len(found)}


def verdict(value: float | None, target: float, at_least: bool) -> str:
    if value is None:
        return "not measured"
    good = value >= target if at_least else value <= target
    return "met" if good else f"missed ({value:.3g} vs {'>=' if at_least else '<='} {target:g})"


GOAL_ROWS = (
    # key, label, goal key, at least
    ("e2e_over_model", "G1 1-stage e2e / model alone, decode rate (wall)", "e2e_over_model",
     True),
    ("e2e_over_model_cpu", "G1 same, CPU basis (model CPU / all processes' CPU per token)",
     "e2e_over_model", True),
    ("three_over_one", "G2 3-stage / 1-stage steady decode (wall)", "three_over_one", True),
    ("three_over_one_cpu", "G2 same, CPU basis (1-stage CPU / 3-stage CPU per token)",
     "three_over_one", True),
    ("fixed_ms_per_stage_3", "G3 fixed cost per stage ms, 3 stages (period - compute) / 3",
     "fixed_ms_per_stage", False),
    ("fixed_ms_per_stage_1", "G3 same, 1 stage", "fixed_ms_per_stage", False),
    ("fixed_cpu_ms_per_stage_3", "G3 same, CPU basis, 3 stages (CPU - model CPU) / 3",
     "fixed_ms_per_stage", False),
    ("fixed_cpu_ms_per_stage_1", "G3 same, CPU basis, 1 stage", "fixed_ms_per_stage", False),
    ("node_cpu_ms_per_token", "G3 node process CPU ms per token (busiest node)",
     "node_cpu_ms_per_token", False),
    ("node_main_cpu_ms_per_token", "G3 same, the node's main thread (its token path; "
     "the SWIM thread's per-second probes apart)", "node_cpu_ms_per_token", False),
)


def measure(repeat: int, tokens: int, weights: str, dtype: str, profile: bool,
            threads: int | None = None, datagrams: bool = False) -> dict[str, Any]:
    result: dict[str, Any] = {"weights": weights, "dtype": dtype, "tokens": tokens,
                              "threads": threads,
                              "repeat": repeat, "load_average_start": os.getloadavg(),
                              "rounds": [], "errors": []}
    with tempfile.TemporaryDirectory(prefix="swactor-hotpath-") as scratch:
        for rep in range(repeat):
            try:
                model = model_step(weights, dtype, tokens, threads)
                print(f"round {rep + 1}: model alone {model['step_ms']:.2f} ms/step, CPU "
                      f"{model['cpu_ms']:.2f} ms/step", flush=True)
                runs = {}
                for stages in (1, 3):
                    run = e2e_run(stages, weights, tokens, Path(scratch) / f"r{rep}-n{stages}",
                                  threads)
                    runs[stages] = run
                    print(f"round {rep + 1}: {stages} stage(s) period {run['period_ms']:.2f} ms,"
                          f" compute {run['compute_ms']:.2f} ms, CPU per token: all "
                          f"{run['cpu_ms_per_token']:.2f}, workers {run['worker_cpu_ms']:.2f}, "
                          f"busiest node {run['node_cpu_ms']:.2f} (main thread "
                          f"{run['node_main_cpu_ms']:.2f}), orchestrator "
                          f"{run['orchestrator_cpu_ms']:.2f} ms", flush=True)
            except Exception as error:  # a failed round is a figure we could not take
                result["errors"].append(f"round {rep + 1}: {type(error).__name__}: {error}")
                print(f"round {rep + 1}: {result['errors'][-1]}", flush=True)
                continue
            same = runs[1]["tokens"] == runs[3]["tokens"]
            result["rounds"].append({"model": model, "one": runs[1], "three": runs[3],
                                     "ratios": round_figures(model, runs[1], runs[3]),
                                     "same_tokens": same})
        if datagrams:
            result["datagrams"] = {}
            for stages in (1, 3):
                try:
                    counted = send_counts(stages, weights, tokens,
                                          Path(scratch) / f"d-n{stages}", threads)
                except Exception as error:
                    counted = f"{type(error).__name__}: {error}"
                result["datagrams"][str(stages)] = counted
        if profile:
            import bench.e2e as e2e
            from bench._profile import profile_stage

            original = e2e._swactor

            def with_weights(*args: str) -> list[str]:
                argv = list(args)
                if argv and argv[0] == "run":
                    argv[1:1] = _run_flags(weights, threads)
                return original(*argv)

            e2e._swactor = with_weights
            try:
                result["profile"] = profile_stage(
                    lambda during: e2e.run_loopback(1, 4 * tokens, Path(scratch) / "p", during),
                    stage=0, warmup=WARMUP)
            finally:
                e2e._swactor = original
    result["goals"] = []
    for key, label, goal_key, at_least in GOAL_ROWS:
        values = spread([r["ratios"][key] for r in result["rounds"]])
        target = GOALS[goal_key]
        result["goals"].append({
            "key": key, "goal": label, "target": target, "at_least": at_least,
            "measured": values,
            "verdict": verdict(values["median"] if values else None, target, at_least)})
    result["load_average_end"] = os.getloadavg()
    return result


def print_result(result: dict[str, Any]) -> None:
    threads = result.get("threads") or "default"
    print(f"per-token path, weights {result['weights']} ({result['dtype']}), threads {threads}, "
          f"{result['tokens']} tokens, {len(result['rounds'])} round(s); load average "
          f"{result['load_average_start'][0]:.1f} -> {result['load_average_end'][0]:.1f}")
    for row in result["goals"]:
        m = row["measured"]
        shown = "n/a" if not m else (f"{m['median']:.3f} [{m['min']:.3f}..{m['max']:.3f}]")
        print(f"  {row['goal']}: {shown} (goal {'>=' if row['at_least'] else '<='} "
              f"{row['target']:g}) -> {row['verdict']}")
    for rnd in result["rounds"]:
        if not rnd["same_tokens"]:
            print("  greedy tokens of 1 and 3 stages DIFFER")
    profile = result.get("profile") or {}
    for name in ("node", "worker"):
        part = profile.get(name) or {}
        top = ", ".join(f"{f['function']} {f['share']:.0%}" for f in part.get("self", [])[:6])
        if top:
            print(f"  1-stage {name} profile (self, {part.get('samples')} samples): {top}")
    for stages, counted in (result.get("datagrams") or {}).items():
        if isinstance(counted, str):
            print(f"  UDP sends per token, {stages} stage(s): not counted ({counted})")
            continue
        each = ", ".join(f"{name} {n:.2f}" for name, n in counted["sends_per_token"].items())
        print(f"  UDP sends per token, {stages} stage(s) (main threads, strace, "
              f"{counted['tokens']} tokens): {counted['sends_per_token_total']:.2f} ({each})")
    for error in result["errors"]:
        print(f"  error: {error}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench hotpath", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=2, help="rounds")
    parser.add_argument("--tokens", type=int, default=48, help="tokens per run")
    parser.add_argument("--weights", default="blocks", help="weight mode (swactor run's)")
    parser.add_argument("--dtype", default="f32", help="the plan's compute dtype")
    parser.add_argument("--profile", action="store_true", help="py-spy the 1-stage run")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--threads", type=int, default=None,
                        help="replay threads per stage (swactor run --threads; default: "
                        "the nodes' default)")
    parser.add_argument("--datagrams", action="store_true",
                        help="count UDP sends per token with strace (two more runs)")
    args = parser.parse_args(argv)
    result = measure(args.repeat, args.tokens, args.weights, args.dtype, args.profile,
                     args.threads, args.datagrams)
    print_result(result)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return 0 if not result["errors"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
