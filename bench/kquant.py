"""K-quant files: memory per stage against the file, and a 1B-class model on 1/2/4 stages.

Theory of operation
-------------------
Every figure comes from a fresh process per stage (:mod:`bench._stage_probe`), run one
after another, on synthetic llama files with random weights (:mod:`bench._synthetic`,
generated once into the model cache):

1. **1B-class shape, 4 of its 16 blocks** (by default): Llama-3.2-1B's width (2048
   wide, FFN 8192, 32/8 heads, vocabulary 128256, tied embeddings), Q4_K_M-like types,
   cut to 4 blocks, on 1, 2 and 4 stages: load time, memory per stage as below, and the
   decode step of each stage (``--decode`` steps from position 0, the median after the
   first three, which build the decode kernels or load them from the kernel cache;
   ``--prompt N`` prefills N positions first, whose kernels take ~40 s per block to
   build here). A pipeline of stages decodes one token after another, so its token
   rate is one over the sum of the stages' step times (transport apart). The middle
   stages of the 4-stage split hold one block and nothing else, so they measure one
   block's figures; the last one less a block measures the output head. From those,
   the whole 16-block model's decode is *estimated* (16 blocks plus the head: the same
   sum on any number of stages) and printed as such; ``--big`` measures it instead
   (the whole model on ``--stages``, about 11 minutes on a shared 2-core machine).
2. **Memory per type.** A 4-block, 2048-wide file per block type (Q4_0, Q4_1, Q5_0,
   Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, and Q4_K_M's mix), split in two stages,
   weights in blocks (and the Q4_K_M file also dense). Per stage: the stage's tensors
   in the file, the resident memory the stage added to its process at ready (RSS at
   ready minus RSS after starting tinygrad) less its KV cache, the ratio of the two
   (the goal: at most 1.25x),
   the KV cache apart, and the planner's prediction of the weights beside the role's own
   count (they must agree exactly).

Bounded time: each probe is announced before it starts, and none starts after
``--budget`` seconds (default 780, under the 900 s `just bench` gives a module); the
ones left are named as skipped, in the output and the JSON. A split is reported only
when all its stages ran.

The machine is shared: the load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gguf import GGMLQuantizationType as Q

from bench._synthetic import LLAMA_1B, LLAMA_1B_CUT, Shape, cached

GOAL = 1.25
MIB = 1 << 20
_MIX = {"attn_v": Q.Q6_K, "ffn_down": Q.Q6_K}


def _type_shapes() -> list[Shape]:
    def shape(name: str, matrix: Q, embd: Q, mix: dict[str, Q] | None = None) -> Shape:
        return Shape(name, blocks=4, hidden=2048, heads=16, kv_heads=4, ffn=5632,
                     vocab=32000, matrix_type=matrix, embd_type=embd,
                     types_by_matrix=mix or {})

    shapes = [shape(f"mem-{t.name.lower()}", t, t)
              for t in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K,
                        Q.Q5_K, Q.Q6_K)]
    shapes.append(shape("mem-q4_k_m", Q.Q4_K, Q.Q6_K, _MIX))
    return shapes


class Budget:
    """Wall time for the whole run: a probe starts only while some is left, and each one
    says so before it starts (``[n] label, elapsed``), so a slow machine shows progress
    and the run ends in about ``seconds`` plus one probe."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = time.monotonic()
        self.count = 0
        self.skipped: list[str] = []

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def admit(self, label: str) -> bool:
        if self.elapsed() > self.seconds:
            self.skipped.append(label)
            print(f"  [skipped: --budget {self.seconds:.0f} s spent] {label}", flush=True)
            return False
        self.count += 1
        print(f"  [{self.count}] {label} ... ({self.elapsed():.0f} s elapsed)", flush=True)
        return True


def _probe(path: Path, start: int, end: int, weights: str, args: argparse.Namespace,
           decode: int = 0) -> dict[str, Any]:
    request = {"path": str(path), "start": start, "end": end, "weights": weights,
               "dtype": args.dtype, "max_seq_len": args.max_seq_len, "decode": decode,
               "prompt": args.prompt}
    t0 = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "bench._stage_probe", json.dumps(request)],
                            capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise RuntimeError(f"stage probe {start}..{end} failed: {result.stderr[-2000:]}")
    row: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    row["wall_s"] = time.monotonic() - t0
    added = row["rss_ready"] - row["rss_base"]
    row["rss_added"] = added
    row["ratio"] = (added - row["kv_bytes"]) / row["file_bytes"]
    return row


def _line(label: str, row: dict[str, Any]) -> str:
    exact = "=" if row["predicted_weights"] == row["weight_bytes"] else "!="
    return (f"  {label:<26} blocks {row['start']:2d}..{row['end']:<2d} file "
            f"{row['file_bytes'] / MIB:7.1f} MiB  RSS +{row['rss_added'] / MIB:7.1f} MiB - KV "
            f"{row['kv_bytes'] / MIB:5.1f} = {row['ratio']:5.2f}x file  (held "
            f"{row['weight_bytes'] / MIB:7.1f} MiB {exact} predicted; load "
            f"{row['load_s']:5.1f} s)")


def _halves(blocks: int, stages: int) -> list[tuple[int, int]]:
    size = blocks // stages
    bounds = [i * size for i in range(stages)] + [blocks]
    return list(itertools.pairwise(bounds))


def memory_per_type(args: argparse.Namespace, budget: Budget) -> list[dict[str, Any]]:
    print(f"memory per stage, 2 stages of a 4-block 2048-wide file, {args.dtype}, "
          f"max_seq_len {args.max_seq_len} (goal: RSS less KV cache <= {GOAL}x file):")
    rows = []
    for shape in _type_shapes():
        modes = ("blocks", "dense") if shape.name == "mem-q4_k_m" else ("blocks",)
        for weights in modes:
            for start, end in _halves(shape.blocks, 2):
                if not budget.admit(f"{shape.name[4:]} --weights {weights}: blocks "
                                    f"{start}..{end}"):
                    continue
                path = cached(shape)  # generated on first use
                row = _probe(path, start, end, weights, args)
                row.update(file=shape.name, weights=weights)
                print(_line(f"{shape.name[4:]} {weights}", row), flush=True)
                rows.append(row)
    return rows


def big_model(args: argparse.Namespace, budget: Budget, shape: Shape = LLAMA_1B
              ) -> list[dict[str, Any]]:
    path = cached(shape)
    prompt = (f"prefill {args.prompt} positions, then" if args.prompt else
              "no prefill,")
    print(f"{shape.name}: {shape.blocks} blocks, {path.stat().st_size / MIB:.0f} MiB, "
          f"weights in blocks, {args.dtype}, {prompt} {args.decode} decode steps (the "
          "first 3 build or load the kernels):")
    rows = []
    for stages in args.stages:
        part = []
        for start, end in _halves(shape.blocks, stages):
            if not budget.admit(f"{shape.name} on {stages} stage(s): blocks {start}..{end}"):
                continue
            row = _probe(path, start, end, "blocks", args, decode=args.decode)
            row.update(stages=stages, model=shape.name)
            prefill = (f", prefill {row['prefill_cold_s']:5.1f} s cold"
                       if "prefill_cold_s" in row else "")
            print(_line(f"{stages} stage(s)", row) + f"; decode {row['decode_ms']:7.1f} "
                  f"ms/step, first 3 steps {row['decode_first_s']:5.1f} s{prefill}",
                  flush=True)
            part.append(row)
        if len(part) == stages:
            rows += part
            total_ms = sum(r["decode_ms"] for r in part)
            print(f"  {stages} stage(s): {1000 / total_ms:.2f} tokens/s (one over the sum "
                  "of the stages' decode steps)", flush=True)
    return rows


def per_block(rows: list[dict[str, Any]], cut: Shape = LLAMA_1B_CUT,
              whole: Shape = LLAMA_1B) -> dict[str, Any] | None:
    """One block's and the output head's figures from a split of ``cut`` into single
    blocks (the middle stages: one block each; the last: a block and the head), and the
    ``whole`` model's decode estimated from them."""
    single = [r for r in rows if r["end"] - r["start"] == 1 and r["stages"] == cut.blocks]
    middle = [r for r in single if r["start"] > 0 and r["end"] < cut.blocks]
    last = [r for r in single if r["end"] == cut.blocks]
    if not middle or not last:
        return None
    block_ms = statistics.median(r["decode_ms"] for r in middle)
    head_ms = max(0.0, last[0]["decode_ms"] - block_ms)
    step_ms = whole.blocks * block_ms + head_ms
    return {"block_decode_ms": block_ms, "head_decode_ms": head_ms,
            "block_file_bytes": statistics.median(r["file_bytes"] for r in middle),
            "block_ratio": statistics.median(r["ratio"] for r in middle),
            "block_load_s": statistics.median(r["load_s"] for r in middle),
            "whole_blocks": whole.blocks, "whole_step_ms": step_ms,
            "whole_tokens_per_s": 1000 / step_ms}


def _print_per_block(figures: dict[str, Any]) -> None:
    print(f"  one block (the 4-stage split's middle stages): file "
          f"{figures['block_file_bytes'] / MIB:.1f} MiB, RSS less KV "
          f"{figures['block_ratio']:.2f}x file, load {figures['block_load_s']:.1f} s, decode "
          f"{figures['block_decode_ms']:.1f} ms; output head (last stage less a block): "
          f"decode {figures['head_decode_ms']:.1f} ms")
    print(f"  ESTIMATE for all {figures['whole_blocks']} blocks (not measured; --big "
          f"measures it): {figures['whole_blocks']} x {figures['block_decode_ms']:.1f} + "
          f"{figures['head_decode_ms']:.1f} = {figures['whole_step_ms']:.0f} ms per token, "
          f"{figures['whole_tokens_per_s']:.2f} tokens/s on any number of stages",
          flush=True)


def markdown(rows: dict[str, Any]) -> list[str]:
    """The report's section: memory per type, the 1B-class shape's figures."""
    lines = ["## Memory per stage per type, and a 1B-class shape", ""]
    types = rows.get("types", [])
    if types:
        lines += [f"Two stages of a 4-block, 2048-wide synthetic file per type, each stage "
                  "in a fresh process; resident memory the stage added at ready less its "
                  f"KV cache, over its tensors' file bytes (goal <= {GOAL}x):", "",
                  "| file | weights | stage | file MiB | RSS less KV / file | held = "
                  "predicted |", "| --- | --- | --- | --- | --- | --- |"]
        for r in types:
            exact = "yes" if r["predicted_weights"] == r["weight_bytes"] else "no"
            lines.append(f"| {r['file'][4:]} | {r['weights']} | {r['start']}..{r['end']} | "
                         f"{r['file_bytes'] / MIB:.1f} | {r['ratio']:.2f}x | {exact} |")
        lines.append("")
    for key in ("cut", "big"):
        model = rows.get(key, [])
        if not model:
            continue
        name = model[0].get("model", "")
        title = ("Llama-3.2-1B's shape cut to 4 of its 16 blocks (same width, FFN, "
                 "vocabulary and tied Q6_K embedding; Q4_K_M-like)" if key == "cut" else
                 "Llama-3.2-1B's shape, all 16 blocks (Q4_K_M-like)")
        lines += [f"{title}, `{name}`, random weights, weights in blocks, one stage per "
                  "fresh process, measured:", "",
                  "| stages | stage blocks | load s | RSS less KV / file | decode ms/step "
                  "| tokens/s |", "| --- | --- | --- | --- | --- | --- |"]
        for stages in sorted({r["stages"] for r in model}):
            part = [r for r in model if r["stages"] == stages]
            rate = 1000 / sum(r["decode_ms"] for r in part)

            def cells(form: str, part: list[dict[str, Any]] = part) -> str:
                return ", ".join(form.format(**r) for r in part)

            lines.append(f"| {stages} | {cells('{start}..{end}')} | {cells('{load_s:.1f}')} "
                         f"| {cells('{ratio:.2f}x')} | {cells('{decode_ms:.0f}')} "
                         f"| {rate:.2f} |")
        lines.append("")
        figures = rows.get("per_block") if key == "cut" else None
        if figures:
            lines += [f"Per block (the 4-stage split's middle stages): "
                      f"{figures['block_file_bytes'] / MIB:.1f} MiB in the file, "
                      f"{figures['block_ratio']:.2f}x held, {figures['block_decode_ms']:.1f} "
                      f"ms decode; output head {figures['head_decode_ms']:.1f} ms. "
                      f"**Estimate**, not measured (`just bench kquant --big` measures it): "
                      f"all {figures['whole_blocks']} blocks plus the head, "
                      f"{figures['whole_step_ms']:.0f} ms per token, "
                      f"{figures['whole_tokens_per_s']:.2f} tokens/s on any number of stages "
                      "(one sequence visits the stages in turn; transport apart).", ""]
    if rows.get("skipped"):
        lines += [f"Not measured (the run's `--budget` was spent): "
                  f"{'; '.join(rows['skipped'])}.", ""]
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench kquant")
    parser.add_argument("--dtype", choices=("f32", "f16"), default="f32")
    parser.add_argument("--max-seq-len", type=int, default=512)
    parser.add_argument("--prompt", type=int, default=0,
                        help="prefill positions before decoding (default 0: decode from "
                        "position 0; a prefill's first build costs ~40 s per block here)")
    parser.add_argument("--decode", type=int, default=8,
                        help="decode steps per stage (the median after the first 3)")
    parser.add_argument("--budget", type=float, default=780.0, metavar="SECONDS",
                        help="start no probe after this many seconds; those left are "
                        "named as skipped (default 780: `just bench` stops a module at "
                        "900)")
    parser.add_argument("--big", action="store_true",
                        help="also the whole 16-block 1B-class model on --stages (about 11 "
                        "min on a small CPU)")
    parser.add_argument("--no-cut", action="store_true",
                        help="leave out the 1B-class shape cut to 4 blocks")
    parser.add_argument("--stages", type=lambda t: [int(x) for x in t.split(",")],
                        default=[1, 2, 4])
    parser.add_argument("--skip-types", action="store_true", help="only the 1B shapes")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = parser.parse_args(argv)
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    budget = Budget(args.budget)
    rows: dict[str, Any] = {}
    if not args.no_cut:
        rows["cut"] = big_model(args, budget, LLAMA_1B_CUT)
        figures = per_block(rows["cut"])
        if figures is not None:
            rows["per_block"] = figures
            _print_per_block(figures)
    if args.big:
        rows["big"] = big_model(args, budget)
    if not args.skip_types:
        rows["types"] = memory_per_type(args, budget)
    if budget.skipped:
        rows["skipped"] = budget.skipped
        print(f"--budget {args.budget:.0f} s spent: {len(budget.skipped)} probe(s) skipped")
    print(f"load average now {os.getloadavg()[0]:.1f}; {budget.elapsed():.0f} s")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    worst = max((r["ratio"] for r in rows.get("types", []) if r["weights"] == "blocks"),
                default=0.0)
    return 0 if worst <= GOAL else 1
