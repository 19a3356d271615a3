"""SmolLM2 quantised by llama.cpp's own quantiser (Q4_K_M, Q5_K_M, Q6_K, Q8_0, Q4_0,
Q3_K_S, and Q2_K with `pure`), and the shipped Q4_1 file: our greedy tokens, on 1 stage
and on 3 stages, equal llama.cpp's on the same file as far as an independent reference
agrees (slow).

Gating, said plainly: these tests need llama.cpp's Python binding in the reference venv
(`tests/model/llama_cpp_quants.py`), which `just reference` builds in about 15
CPU-minutes. CI does not build it, so in CI (and on any machine without it) these tests
are skipped, with that reason in the skip line; they prove nothing there. `just
reference` runs them with `SWACTOR_REQUIRE_REFERENCE=1`, which turns a missing venv
into a failure instead of a skip. Each file costs 1-2.5 CPU-minutes, so every one is
marked `soak` (`just soak-tests`, and `just reference` runs them all); `just test` keeps
the per-type kernel checks against the f64 reference on small files
(`tests/model/test_stage_role.py`).

Method, per file (made once by `llama_model_quantize` with `allow_requantize` from the
shipped Q4_1 file and cached in the model cache; its tensor types are checked to be
what llama.cpp writes for the type): the same prompt ids go to llama.cpp (greedy
argmax, runner-up and their logit gap at each step) and to our stage roles, weights in
blocks as a node holds them, f32: one role over all 30 blocks, and three roles over
10/10/10 chained. The 3-stage tokens must equal the 1-stage tokens. Ours must equal
llama.cpp's up to the first token where they differ, if any; there the independent
reference decides: an f64 numpy forward pass over gguf-py's own dequantisation
(`numpy_reference.NumpyLlama`, no code shared with either side; gguf-py's values are
ggml's own `to_float` ones, bit for bit, on every type of these files) on the same
prefix must pick our token, and our logits there must be its logits to within
`LOGIT_TOL` over the whole vocabulary. Where our products themselves take int8
activations (Q4_1 on x86-64, `conftest.int8_inputs`), our logits carry that
quantisation's error as llama.cpp's do (about 0.8-0.9 of SmolLM2's logits: over 30
blocks the rounding of a few activations decides which others round the other way).
There our logits must be no further from the f64 pass's than `INT8_FACTOR` times
llama.cpp's own logits for the prefix are, and our token's f64 logit must be within our
logits' distance of the f64 top. llama.cpp multiplies by activations it quantises to 8
bits (Q8_0 or Q8_K blocks, by the weight's type), so where tokens are close it may take
another one, after which the two continuations no longer share a
prefix and are not compared. How close is close: llama.cpp's own logit for our token
must be within `NEAR_TIE` of its top one, or, where it is not, within the rounding
spread of llama.cpp itself at that position: the largest difference between the logits
its two CPU code paths compute for the same prefix (with its repacked weight layouts,
as it runs by default here, and without them). On SmolLM2 in Q2_K (`Q2_K-pure`) five
tokens lie within 1.2 logits at the first token of a prompt and quantising the
activations alone moves logits by up to 3.5, so llama.cpp's two paths there pick two
different tokens, neither ours nor the f64 pass's.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from gguf import GGUFReader

from swactor.model.gguf_range import open_reader
from swactor.model.llama_role import StageRole
from swactor.model.paths import default_model_path
from swactor.model.tokenizer import Tokenizer
from tests.model.conftest import int8_inputs
from tests.model.llama_cpp_quants import (
    QUANT_KINDS,
    ensure_quant,
    llama_cpp_greedy,
    llama_cpp_logits,
    reference_ready,
)

_WHY_NOT = reference_ready()
if _WHY_NOT is not None and os.environ.get("SWACTOR_REQUIRE_REFERENCE"):
    raise RuntimeError(f"SWACTOR_REQUIRE_REFERENCE is set but {_WHY_NOT}")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(_WHY_NOT is not None,
                       reason=f"llama.cpp reference not available ({_WHY_NOT}); CI does not "
                       "build it, `just reference` does and runs these tests"),
]

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
TOKENS = 16
MAX_SEQ = 64
SPLIT = ((0, 10), (10, 20), (20, 30))
NEAR_TIE = 0.5
"""The llama.cpp logit gap between its token and ours accepted at a divergence without
asking llama.cpp's two CPU paths for their spread (SmolLM2's top logits are ~15-25)."""
LOGIT_TOL = 0.01
"""The largest difference between our f32 logits and the f64 reference's at a divergence
(f32 rounding over 30 blocks is ~1e-4 there)."""
INT8_FACTOR = 2.0
"""How much further from the f64 logits than llama.cpp's ours may be where both take int8
activations (measured on the shipped Q4_1 file: 0.91 against llama.cpp's 0.77)."""
# what llama.cpp writes for each type on SmolLM2 (576 wide: rows not a multiple of 256
# fall back from K-quants to Q5_0/Q8_0 in the _M mixes)
MUST_HOLD = {"Q4_1": {"Q4_1"}, "Q4_K_M": {"Q4_K", "Q6_K"}, "Q5_K_M": {"Q5_K", "Q6_K"},
             "Q6_K": {"Q6_K"}, "Q8_0": {"Q8_0"}, "Q4_0": {"Q4_0"}, "Q3_K_S": {"Q3_K"},
             "Q2_K-pure": {"Q2_K"}}


def _roles(path: Path, split: tuple[tuple[int, int], ...]) -> list[StageRole]:
    reader = open_reader(path)
    return [StageRole(reader.load_stage(start, end, is_first=i == 0, is_last=i == len(split) - 1,
                                        keep_blocks=True),
                      max_seq_len=MAX_SEQ, quantised=True)
            for i, (start, end) in enumerate(split)]


def _greedy(roles: list[StageRole], prompt: list[int]
            ) -> tuple[list[int], list[npt.NDArray[np.float32]]]:
    """Greedy tokens, and the last role's logits at each step."""
    tokens: list[int] = []
    logits: list[npt.NDArray[np.float32]] = []
    payload = np.array(prompt, dtype=np.int32)
    for step in range(TOKENS):
        obj: npt.NDArray[np.generic] = payload
        for role in roles:
            obj = role.step(step, obj)
        tokens.append(int(obj[0]))
        assert roles[-1].last_logits is not None
        logits.append(roles[-1].last_logits.copy())
        payload = np.array([tokens[-1]], dtype=np.int32)
    return tokens, logits


@pytest.mark.soak
@pytest.mark.parametrize("kind", ["Q4_1", *QUANT_KINDS])
def test_greedy_tokens_equal_llama_cpp(kind: str) -> None:
    path = default_model_path() if kind == "Q4_1" else ensure_quant(kind)
    types = Counter(t.tensor_type.name for t in GGUFReader(str(path)).tensors)
    assert MUST_HOLD[kind] <= set(types), f"{path.name} holds {dict(types)}"
    tokenizer = Tokenizer.from_gguf(path)
    prompts = [list(tokenizer.encode(text)) for text in PROMPTS]
    theirs = llama_cpp_greedy(path, prompts, TOKENS)
    one = [_greedy(_roles(path, ((0, 30),)), prompt) for prompt in prompts]
    three = [_greedy(_roles(path, SPLIT), prompt)[0] for prompt in prompts]
    assert three == [tokens for tokens, _ in one], "3 stages differ from 1 stage"
    for text, prompt, (ours, logits), ref in zip(PROMPTS, prompts, one, theirs, strict=True):
        where = next((i for i, (a, b) in enumerate(zip(ours, ref["greedy"], strict=True))
                      if a != b), None)
        print(f"{kind} {text!r}: {TOKENS if where is None else where} of {TOKENS} tokens "
              f"equal llama.cpp's; ours {tokenizer.decode(ours)!r}")
        if where is None:
            continue
        from tests.model.numpy_reference import NumpyLlama

        prefix = prompt + ours[:where]
        exact = NumpyLlama(path).logits(prefix)
        top = dict(ref["top"][where])
        best = ref["top"][where][0][1]
        gap = best - top[ours[where]] if ours[where] in top else float("inf")
        error = float(np.max(np.abs(logits[where] - exact)))
        print(f"  at token {where}: ours {ours[where]}, llama.cpp {ref['greedy'][where]}, "
              f"llama.cpp's logit for ours {gap:.3f} below its top; f64 reference "
              f"{int(np.argmax(exact))}, our logits within {error:.2g} of its")
        if int8_inputs() & set(types):
            theirs = max(float(np.max(np.abs(rows[0] - exact)))
                         for rows in llama_cpp_logits(path, [prefix]))
            print(f"  int8 activations: llama.cpp's logits within {theirs:.2g} of the f64 "
                  "reference's")
            assert error < INT8_FACTOR * theirs, "our logits are further off than llama.cpp's"
            assert exact.max() - exact[ours[where]] < error, "not a tie within our rounding"
        else:
            assert int(np.argmax(exact)) == ours[where], "the f64 reference sides with llama.cpp"
            assert error < LOGIT_TOL, "our logits are not the f64 reference's"
        if gap < NEAR_TIE:
            continue
        repacked, plain = (rows[0] for rows in llama_cpp_logits(path, [prefix]))
        spread = float(np.max(np.abs(repacked - plain)))
        gap = float(repacked.max() - repacked[ours[where]])
        print(f"  llama.cpp's two CPU paths: tokens {int(np.argmax(repacked))} and "
              f"{int(np.argmax(plain))}, logits up to {spread:.3f} apart; its logit for "
              f"ours {gap:.3f} below its top")
        assert gap < spread, "llama.cpp's choice is not a near-tie with ours"
