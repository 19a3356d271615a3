"""Our tokenizer on llama.cpp's own tokenizer tests: the real vocabularies of Qwen2, Llama 3
(`llama-bpe`), Llama 2 (`llama-spm`), GPT-2, Phi-3, Refact and StarCoder, each string's
ids equal to the ids llama.cpp's test expects (no BOS).

Gating, said plainly: the files come from llama-cpp-python's source archive on the
package index (`tests/model/llama_cpp_vocab.py`), which `just quants` (and so `just
reference`) downloads once into the model cache. Where they were never fetched (CI) these
tests are skipped, with that reason in the skip line; they prove nothing there.
`SWACTOR_REQUIRE_REFERENCE=1` turns the missing files into a failure instead.
"""

from __future__ import annotations

import os

import pytest
from gguf import GGUFReader

from swactor.model.tokenizer import Tokenizer
from tests.model.llama_cpp_vocab import VOCABS, missing, vocab_cases, vocab_path

_MISSING = missing()
if _MISSING and os.environ.get("SWACTOR_REQUIRE_REFERENCE"):
    raise RuntimeError(f"SWACTOR_REQUIRE_REFERENCE is set but llama.cpp's vocabulary files "
                       f"for {', '.join(_MISSING)} are not in the model cache (`just quants`)")


@pytest.mark.parametrize("name", VOCABS)
def test_ids_equal_llama_cpps_tokenizer_test(name: str) -> None:
    if name in _MISSING:
        pytest.skip(f"llama.cpp's ggml-vocab-{name}.gguf is not in the model cache: `just "
                    "quants` downloads llama-cpp-python's source archive for it; CI does not")
    tokenizer = Tokenizer.from_gguf(vocab_path(name))
    cases = vocab_cases(name)
    assert len(cases) >= 40
    wrong = [(text, ids, tokenizer.encode(text, add_bos=False)) for text, ids in cases
             if tokenizer.encode(text, add_bos=False) != ids]
    assert not wrong, f"{len(wrong)} of {len(cases)} differ, first: {wrong[0]!r}"


def test_the_qwen2_file_is_qwen2s_tokenizer() -> None:
    if "qwen2" in _MISSING:
        pytest.skip("llama.cpp's ggml-vocab-qwen2.gguf is not in the model cache (`just "
                    "quants`)")
    fields = GGUFReader(str(vocab_path("qwen2"))).fields
    assert fields["general.architecture"].contents() == "qwen2"
    assert fields["tokenizer.ggml.pre"].contents() == "qwen2"
    assert len(fields["tokenizer.ggml.tokens"].data) == 151936
