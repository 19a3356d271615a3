"""``just reference``: compare our tokenizer ids and greedy tokens with llama.cpp's on SmolLM2.

Not a pytest module (no ``test_`` prefix) and not part of ``just test``. llama.cpp's Python
binding lives in its own virtual environment (``~/.cache/swactor/venv-reference``, built
by the recipe). This script runs in ours and asks that interpreter, in a subprocess, for
llama.cpp's token ids and greedy continuation (argmax of the last logits row); then it runs
our tokenizer and one :class:`StageRole` on the same file and prints, per prompt, where the
two first differ. Exit status 1 when any prompt's tokenizer ids differ.

Greedy tokens are printed, not judged here: two correct implementations part at a near-tie
(two logits closer than their rounding differences), so the verdict on greedy equality is
`tests/model/test_llama_cpp_quants.py`'s, which `just reference` runs next: equal up to the
first difference, and there llama.cpp's own logit for our token within `NEAR_TIE` of its
top and an independent float64 pass picking ours.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

PROMPTS = [
    "hello world",
    "The capital of France is",
    "Once upon a time, in a village by the sea,",
    "def fibonacci(n):",
    "Café, naïve, 12345 — 🙂 and  two  spaces\nnew line",
]

_LLAMA_SIDE = r"""
import json, sys
import numpy as np
import llama_cpp
path, tokens, prompts = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_threads=2, verbose=False,
                      logits_all=True)  # else llm.scores stays zero (0.3.x)
out = []
for text in prompts:
    ids = llm.tokenize(text.encode(), add_bos=False, special=True)
    llm.reset()
    llm.eval(ids)
    gen = []
    for _ in range(tokens):
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        gen.append(tok)
        llm.eval([tok])
    out.append({"ids": ids, "greedy": gen})
print(json.dumps(out))
"""


def _first_difference(ours: list[int], theirs: list[int]) -> int | None:
    for index, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            return index
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))


def main(argv: list[str]) -> int:
    from swactor.model.gguf_range import open_reader
    from swactor.model.llama_role import StageRole
    from swactor.model.paths import default_model_path
    from swactor.model.tokenizer import Tokenizer

    parser = argparse.ArgumentParser(prog="reference_llama_cpp")
    parser.add_argument(
        "--python", default=str(Path.home() / ".cache/swactor/venv-reference/bin/python")
    )
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--model", default=str(default_model_path()))
    parser.add_argument("--weights", choices=("dense", "blocks"), default="dense",
                        help="our stage's weight mode (blocks: computed from the file's "
                             "quantised blocks)")
    args = parser.parse_args(argv)
    result = subprocess.run(
        [args.python, "-c", _LLAMA_SIDE, args.model, str(args.tokens), json.dumps(PROMPTS)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if result.returncode != 0:
        print(f"llama.cpp side failed:\n{result.stderr[-2000:]}", file=sys.stderr)
        return 2
    theirs = json.loads(result.stdout.strip().splitlines()[-1])
    tokenizer = Tokenizer.from_gguf(args.model)
    reader = open_reader(args.model)
    blocks = args.weights == "blocks"
    weights = reader.load_stage(0, reader.facts.block_count, is_first=True, is_last=True,
                                keep_blocks=blocks)
    role = StageRole(weights, max_seq_len=256, quantised=blocks)
    status = 0
    for text, ref in zip(PROMPTS, theirs, strict=True):
        ids = list(tokenizer.encode(text))
        where = _first_difference(ids, ref["ids"])
        print(f"prompt {text!r}")
        if where is not None:
            status = 1
            print(f"  tokenizer differs at {where}: ours {ids[where:where + 5]} "
                  f"llama.cpp {ref['ids'][where:where + 5]}")
            ids = ref["ids"]  # compare the model on the same input ids
        else:
            print(f"  tokenizer: {len(ids)} ids identical")
        out = role.step(0, np.array(ids, dtype=np.int32))
        greedy = [int(out[0])]
        for step in range(1, args.tokens):
            out = role.step(step, out)
            greedy.append(int(out[0]))
        where = _first_difference(greedy, ref["greedy"])
        if where is None:
            print(f"  greedy: {args.tokens} tokens identical: {tokenizer.decode(greedy)!r}")
        else:
            print(f"  greedy differs at token {where} (judged by test_llama_cpp_quants): "
                  f"ours {greedy[where:where + 5]} llama.cpp {ref['greedy'][where:where + 5]}")
            print(f"    ours      {tokenizer.decode(greedy)!r}")
            print(f"    llama.cpp {tokenizer.decode(ref['greedy'])!r}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
