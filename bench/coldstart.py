"""Cold start: tokenize time, load and first token with an empty and a warm kernel cache.

Theory of operation
-------------------
One invocation, every figure side by side under the same load:

1. **Tokenize.** ``swactor tokenize --json "hello world"`` as a fresh process, ``--repeat``
   times; the median wall time of the whole command (interpreter start included).
2. **First run ever, then a second run.** ``swactor run --nodes N --prompt "hello world"
   --json`` with ``SWACTOR_KERNEL_CACHE`` and tinygrad's ``CACHEDB`` pointed at empty
   temporary directories: nothing a worker builds is on disk before the first run, and
   the second run (same directories) finds what the first one left. From each run's JSON:
   load (pool ready to every stage ready: the readiness barrier; the workers' weight load
   and kernel warm-up are inside it), the first token after the barrier, and the decode
   rate after the first token. Both weight modes (``--weights``) are run this way.
3. **Single stage.** For each weight mode, the model's own decode rate in this process: one
   role over every block, the same dtype as a run (f32), warmed up from the cache the runs
   filled, the median step of ``--tokens`` greedy steps. The second run's decode rate over
   this is the demo's ratio (goal: at least 0.85).

Goals (the report's cold-start row): first token after the barrier <= 2 s with a warm
cache and <= 10 s on the first run ever; pool ready to the barrier <= 3 s (warm cache);
the whole ``swactor tokenize`` command <= 0.5 s. ``--json PATH`` writes every figure for the report.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GOALS = {"tokenize_s": 0.5, "warm_first_token_s": 2.0, "cold_first_token_s": 10.0,
         "warm_load_s": 3.0, "demo_over_single_stage": 0.85}
PROMPT = "hello world"


def tokenize_seconds(repeat: int) -> tuple[list[float], list[float]]:
    """Wall and CPU (user + system) seconds of each whole `swactor tokenize` command."""
    walls, cpus = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "swactor.cli", "tokenize", "--json", PROMPT],
                       check=True, capture_output=True, timeout=120)
        walls.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return walls, cpus


def one_run(nodes: int, weights: str, tokens: int, env: dict[str, str]) -> dict[str, Any]:
    """One `swactor run` as a subprocess; its timings and the wall time of the command."""
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "swactor.cli", "run", "--nodes", str(nodes), "--prompt", PROMPT,
         "--max-tokens", str(tokens), "--weights", weights, "--json"],
        capture_output=True, text=True, timeout=1800, env=env)
    wall = time.perf_counter() - started
    line = next((x for x in reversed(result.stdout.splitlines()) if x.startswith("{")), None)
    if line is None:
        return {"error": f"rc {result.returncode}: {result.stderr[-2000:]}", "wall_s": wall}
    report = json.loads(line)
    timings = report.get("timings", {})
    figures = {"load_s": timings.get("load_s"), "first_token_s": timings.get("ttft_s"),
               "decode_tokens_per_s": timings.get("tokens_per_s"), "wall_s": wall,
               "generated": len(report.get("generated_token_ids") or []),
               "outcome": report.get("outcome")}
    if result.returncode != 0:
        figures["error"] = f"rc {result.returncode}: fault {report.get('fault')}"
    return figures


def single_stage_rate(weights: str, tokens: int) -> float:
    """Decode tokens/s of one role over every block (f32), from the warm kernel cache."""
    import numpy as np

    from swactor.model.gguf_range import open_reader
    from swactor.model.llama_role import StageRole
    from swactor.model.paths import default_model_path
    from swactor.model.tokenizer import Tokenizer

    blocks = weights == "blocks"
    reader = open_reader(default_model_path())
    facts = reader.facts
    stage = reader.load_stage(0, facts.block_count, is_first=True, is_last=True, dtype="f32",
                              keep_blocks=blocks)
    role = StageRole(stage, max_seq_len=512, quantised=blocks)
    del stage
    role.warm_up()
    ids = Tokenizer.from_gguf(default_model_path()).encode(PROMPT)
    out = role.step(0, np.array(ids, dtype=np.int32))
    steps = []
    for sequence in range(1, tokens + 1):
        started = time.perf_counter()
        out = role.step(sequence, out)
        steps.append(time.perf_counter() - started)
    return 1.0 / statistics.median(steps[2:] or steps)


def verdict(value: float | None, target: float, at_least: bool) -> str:
    if value is None:
        return "not measured"
    good = value >= target if at_least else value <= target
    return "met" if good else f"missed ({value:.3g} vs {'>=' if at_least else '<='} {target:g})"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench coldstart", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32, help="tokens per run")
    parser.add_argument("--repeat", type=int, default=3, help="tokenize runs")
    parser.add_argument("--weights", default="dense,blocks", help="weight modes to run")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)

    figures: dict[str, Any] = {"load_average_start": os.getloadavg(), "nodes": args.nodes}
    times, cpus = tokenize_seconds(args.repeat)
    figures["tokenize_s"] = statistics.median(times)
    figures["tokenize_cpu_s"] = statistics.median(cpus)
    print(f"swactor tokenize --json {PROMPT!r}: median {figures['tokenize_s']:.3f} s wall "
          f"({', '.join(f'{t:.3f}' for t in times)}), {figures['tokenize_cpu_s']:.3f} s CPU "
          f"-> {verdict(figures['tokenize_s'], GOALS['tokenize_s'], False)} (wall); the CPU "
          "figure is what it takes with a core to itself", flush=True)

    modes: dict[str, Any] = {}
    for weights in [w for w in args.weights.split(",") if w]:
        with tempfile.TemporaryDirectory(prefix="swactor-coldstart-") as tmp:
            env = {**os.environ, "SWACTOR_KERNEL_CACHE": f"{tmp}/kernels",
                   "CACHEDB": f"{tmp}/tinygrad-cache.db"}
            cold = one_run(args.nodes, weights, args.tokens, env)
            print(f"{weights}: first run ever {cold}", flush=True)
            warm = one_run(args.nodes, weights, args.tokens, env)
            print(f"{weights}: second run     {warm}", flush=True)
            saved = os.environ.get("SWACTOR_KERNEL_CACHE")
            os.environ["SWACTOR_KERNEL_CACHE"] = f"{tmp}/kernels"
            try:
                single = single_stage_rate(weights, args.tokens)
            finally:
                if saved is None:
                    os.environ.pop("SWACTOR_KERNEL_CACHE", None)
                else:
                    os.environ["SWACTOR_KERNEL_CACHE"] = saved
        demo = warm.get("decode_tokens_per_s")
        ratio = demo / single if demo and single else None
        print(f"{weights}: single stage {single:.1f} tokens/s; second run's decode over it: "
              f"{ratio if ratio is None else round(ratio, 3)}", flush=True)
        modes[weights] = {"cold": cold, "warm": warm, "single_stage_tokens_per_s": single,
                          "demo_over_single_stage": ratio}
    figures["modes"] = modes
    figures["load_average_end"] = os.getloadavg()

    print(f"goals ({args.nodes} nodes, load average {figures['load_average_start'][0]:.1f} "
          f"-> {figures['load_average_end'][0]:.1f}):")
    for weights, mode in modes.items():
        cold, warm = mode["cold"], mode["warm"]
        rows = [
            ("first token after the barrier, warm cache", warm.get("first_token_s"),
             GOALS["warm_first_token_s"], False),
            ("first token after the barrier, first run ever", cold.get("first_token_s"),
             GOALS["cold_first_token_s"], False),
            ("pool ready -> barrier, warm cache", warm.get("load_s"), GOALS["warm_load_s"],
             False),
            ("pool ready -> barrier, first run ever", cold.get("load_s"), None, False),
            ("second run decode / single stage", mode["demo_over_single_stage"],
             GOALS["demo_over_single_stage"], True),
        ]
        for name, value, target, at_least in rows:
            shown = "n/a" if value is None else f"{value:.3g}"
            judged = "" if target is None else f" -> {verdict(value, target, at_least)}"
            print(f"  [{weights}] {name}: {shown}{judged}")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    failed = any("error" in m["cold"] or "error" in m["warm"] for m in modes.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
