"""Mixed steps on SmolLM2: a prompt and D decode rows apart against one mixed step, side by side.

Theory of operation
-------------------
While a serving stage prefills a prompt, the sequences it is decoding wait for the
prefill and then pay a decode step of their own. ``StageRole.run_mixed`` runs the
prompt and their rows as one step, bit-identical to the two apart (the module doc of
:mod:`swactor.model.llama_role`, "Mixed steps"). This measures what that saves.

One single-stage role (all 30 blocks, ``--dtype``, Q4_1 blocks as a serving stage holds
them) with ``2 D + 2`` KV slots: slots ``0..D-1`` decode apart, ``D..2D-1`` the same rows
inside mixed steps, and the prompt goes to slot ``2D`` apart and ``2D + 1`` mixed. For
each prompt of ``bench serve``'s prompt set and each ``D`` of ``--rows``, ``--steps``
pairs back to back: the prompt's prefill then the ``D``-row batch (``run_tagged`` then
``run_batch``), then the same as one ``run_mixed``; the first ``--skip`` pairs build
the graphs and are not counted. Per prompt length and ``D``: the median wall time of
each side and their ratio (apart / mixed: above 1, the mixed step is faster). Every
pair's logits must be bit for bit the same on both sides, or the run fails. Where the
rows do not fit in the prompt's padding rows the role itself runs the step apart
(``StageRole._mixable``), so those lines compare the same work twice: a ratio near 1.

The decode JITs for ``D`` rows are built (or loaded from the kernel cache) first. The
machine is shared: the load average is printed beside the figures, and the ratios pair
figures taken milliseconds apart.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import numpy.typing as npt

from bench.batch import add_threads_option, apply_threads_option
from bench.serve import PROMPTS
from swactor.model import cpu_graph
from swactor.model.gguf_range import open_reader
from swactor.model.llama_role import StageRole
from swactor.model.paths import default_model_path
from swactor.model.tokenizer import Tokenizer
from swactor.wire.tags import SequenceTag

CONTEXT = "Once upon a time there was a little"
"""What each decoding sequence was prompted with."""


def _bits(array: npt.NDArray[np.float32] | None) -> npt.NDArray[np.int32]:
    assert array is not None
    return np.ascontiguousarray(array, dtype=np.float32).view(np.int32).copy()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench mixed", description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,3", help="decode rows D per step (comma-separated)")
    parser.add_argument("--steps", type=int, default=5, help="pairs per prompt and D")
    parser.add_argument("--skip", type=int, default=2,
                        help="first pairs not counted (they build the graphs)")
    parser.add_argument("--dtype", choices=("f32", "f16"), default="f32")
    add_threads_option(parser)
    args = parser.parse_args(argv)
    apply_threads_option(parser, args)
    rows = sorted({int(r) for r in args.rows.split(",")})
    if not rows or rows[0] < 1 or rows[-1] > 8:
        parser.error("--rows must be integers in 1..8")
    if args.steps <= args.skip or args.skip < 0:
        parser.error("--steps must exceed --skip, and --skip must not be negative")
    path = default_model_path()
    if not path.is_file():
        print(f"bench mixed: {path} missing; run scripts/setup.sh", file=sys.stderr)
        return 1
    tokenizer = Tokenizer.from_gguf(path)
    prompts = [list(tokenizer.encode(p)) for bucket in PROMPTS.values() for p in bucket]
    context = list(tokenizer.encode(CONTEXT))
    count = max(rows)
    slots = 2 * count + 2
    max_seq = 256
    t0 = time.perf_counter()
    weights = open_reader(path).load_stage(0, 30, is_first=True, is_last=True,
                                           dtype=args.dtype, keep_blocks=True)
    role = StageRole(weights, max_seq_len=max_seq, quantised=True, slots=slots)
    role.warm_up(rows=[r for r in rows if r > 1])
    print(f"SmolLM2 single stage on {role.device}, {args.dtype} blocks, {slots} slots of "
          f"{max_seq} positions, {cpu_graph.threads()} replay threads; loaded and decode "
          f"JITs ready in {time.perf_counter() - t0:.1f} s; load average "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    apart_slot, mixed_slot = 2 * count, 2 * count + 1
    print(f"  {args.steps - args.skip} pairs per line after {args.skip} not counted; "
          f"apart = prefill then the D-row batch, mixed = one run_mixed")
    for prompt in sorted(prompts, key=len):
        ids = np.array(prompt, dtype=np.int32)
        for d in rows:
            # fresh contexts each line, so positions stay far below max_seq
            tokens = []
            for b in range(d):
                for shift in (0, count):
                    out = role.run_tagged(SequenceTag(b + shift, 0),
                                          np.array(context, dtype=np.int32))
                tokens.append(int(out[0]))
            positions = [len(context)] * d
            apart: list[float] = []
            mixed: list[float] = []
            for step in range(args.steps):
                w0 = time.perf_counter()
                role.run_tagged(SequenceTag(apart_slot, 0), ids)
                want_prompt = _bits(role.last_logits)
                answer = role.run_batch([SequenceTag(b, positions[b]) for b in range(d)],
                                        np.array(tokens, dtype=np.int32))
                want_rows = _bits(role.last_logits)
                w1 = time.perf_counter()
                role.run_mixed(SequenceTag(mixed_slot, len(prompt)),
                               [SequenceTag(b + count, positions[b]) for b in range(d)],
                               np.concatenate([ids, np.array(tokens, dtype=np.int32)]))
                w2 = time.perf_counter()
                got = _bits(role.last_logits)
                if not (np.array_equal(got[0], want_prompt)
                        and np.array_equal(got[1:], want_rows.reshape(d, -1))):
                    print(f"bench mixed: a {len(prompt)}-token prompt with {d} rows: the "
                          f"mixed step's logits differ from the step apart", file=sys.stderr)
                    return 1
                if step >= args.skip:
                    apart.append(w1 - w0)
                    mixed.append(w2 - w1)
                tokens = [int(t) for t in answer]
                positions = [p + 1 for p in positions]
            a, m = statistics.median(apart), statistics.median(mixed)
            print(f"  prompt {len(prompt):3d} tokens + {d} rows: apart {a * 1e3:6.1f} ms, "
                  f"mixed {m * 1e3:6.1f} ms, apart/mixed {a / m:4.2f}x", flush=True)
    print(f"  load average {os.getloadavg()[0]:.1f}; logits bit-identical in every pair")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
