"""SmolLM2 quantised by llama.cpp's own quantiser; llama.cpp's greedy tokens and logits.

Not a pytest module: the helpers behind `tests/model/test_llama_cpp_quants.py` and
`just quants` / `just reference`. llama.cpp's Python binding lives in its own virtual
environment (`reference_python()`: `$SWACTOR_REFERENCE_VENV`, default
`~/.cache/swactor/venv-reference`, built by `just reference`); this module runs in ours
and asks that interpreter, in a subprocess, to quantise or to generate.

Files. `quant_path(kind)` is `<model cache>/SmolLM2-135M-Instruct.llamacpp-<KIND>.gguf`:
the shipped Q4_1 SmolLM2 requantised (`llama_model_quantize` with `allow_requantize`, and
`pure` for a `-pure` kind) to `kind`, written under a temporary name and renamed, and
kept like the model: made once, reused after. Requantising from Q4_1 loses precision
against a quantisation of the f16 weights, but the files are what llama.cpp writes for
each type (its own choice of per-tensor types for the `_M` mixes included), which is
what these tests need.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from swactor.model.paths import default_model_path, model_cache_dir

QUANT_KINDS = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0", "Q3_K_S", "Q2_K-pure")
"""llama.cpp's file types (``LLAMA_FTYPE_MOSTLY_<KIND>``); ``-pure``: with its ``pure``
flag, every tensor the type's own (where the row width allows it), not its mix. SmolLM2's
Q2_K and Q3_K_S mixes both hold Q3_K (ffn_down) and no Q2_K tensor, hence Q2_K-pure."""
REFERENCE_VENV_ENV = "SWACTOR_REFERENCE_VENV"

_QUANTISE = r"""
import ctypes, os, sys
import llama_cpp
source, target, kind = sys.argv[1], sys.argv[2], sys.argv[3]
ftype, _, variant = kind.partition("-")
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + ftype)
params.allow_requantize = True
params.pure = variant == "pure"
params.nthread = 2
rc = llama_cpp.llama_model_quantize(source.encode(), target.encode(), ctypes.byref(params))
sys.exit(0 if rc == 0 else 10 + rc)
"""

_GREEDY = r"""
import json, sys
import numpy as np
import llama_cpp
path, tokens, threads, TOP = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), 5
prompts = json.loads(sys.argv[4])
llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_threads=threads, verbose=False,
                      logits_all=True)  # else llm.scores stays zero (0.3.x)
out = []
for ids in prompts:
    llm.reset()
    llm.eval(ids)
    gen, tops = [], []
    for _ in range(tokens):
        row = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        top = np.argsort(row)[::-1][:TOP]
        gen.append(int(top[0]))
        tops.append([[int(i), float(row[i])] for i in top])
        llm.eval([gen[-1]])
    out.append({"greedy": gen, "top": tops})
print(json.dumps(out))
"""


_LOGITS = r"""
import json, sys
import numpy as np
import llama_cpp
import llama_cpp.llama_cpp as C
path, threads, out, sequences = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
default = C.llama_model_default_params
rows = []
for repack in (True, False):
    def params(repack=repack):
        p = default()
        p.use_extra_bufts = repack  # False: no repacked weights, ggml's plain vec_dot kernels
        return p
    C.llama_model_default_params = params
    llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_threads=threads, verbose=False,
                          logits_all=True)
    for ids in sequences:
        llm.reset()
        llm.eval(ids)
        rows.append(np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32))
    del llm
np.save(out, np.stack(rows).reshape(2, len(sequences), -1))
"""


def reference_python() -> Path:
    """The reference venv's interpreter (it may not exist)."""
    venv = os.environ.get(REFERENCE_VENV_ENV) or str(
        Path.home() / ".cache" / "swactor" / "venv-reference")
    return Path(venv) / "bin" / "python"


def reference_ready() -> str | None:
    """None when llama.cpp's binding imports in the reference venv, else why not."""
    python = reference_python()
    if not python.is_file():
        return f"no reference venv at {python.parent.parent} (`just reference` builds it)"
    done = subprocess.run([str(python), "-c", "import llama_cpp"], capture_output=True,
                          text=True, timeout=120, check=False)
    if done.returncode != 0:
        return f"llama_cpp does not import in {python}: {done.stderr.strip()[-300:]}"
    return None


def quant_path(kind: str) -> Path:
    return model_cache_dir() / f"SmolLM2-135M-Instruct.llamacpp-{kind}.gguf"


def ensure_quant(kind: str, python: Path | None = None) -> Path:
    """The `kind` file (module doc), made by llama.cpp's quantiser when it is missing."""
    if kind not in QUANT_KINDS:
        raise ValueError(f"quantisation {kind!r} (made here: {', '.join(QUANT_KINDS)})")
    target = quant_path(kind)
    if target.is_file():
        return target
    source = default_model_path()
    if not source.is_file():
        raise FileNotFoundError(f"{source} missing: run scripts/setup.sh")
    part = target.with_name(f".{target.name}.part-{os.getpid()}")
    try:
        done = subprocess.run([str(python or reference_python()), "-c", _QUANTISE,
                               str(source), str(part), kind],
                              capture_output=True, text=True, timeout=1800, check=False)
        if done.returncode != 0 or not part.is_file():
            raise RuntimeError(f"llama.cpp could not quantise {source} to {kind} "
                               f"(exit {done.returncode}): {done.stderr.strip()[-1000:]}")
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)
    return target


def llama_cpp_greedy(path: Path, prompts: list[list[int]], tokens: int, threads: int = 2,
                     python: Path | None = None) -> list[dict[str, list[Any]]]:
    """llama.cpp's greedy continuation of each prompt (token ids) on `path`: per prompt,
    `greedy` (argmax of the last logits row, fed back) and `top`, at each step the five
    highest `[token, logit]` pairs, highest first."""
    done = subprocess.run(
        [str(python or reference_python()), "-c", _GREEDY, str(path), str(tokens),
         str(threads), json.dumps(prompts)],
        capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp on {path} failed: {done.stderr.strip()[-2000:]}")
    result: list[dict[str, list[Any]]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def llama_cpp_logits(path: Path, sequences: list[list[int]], threads: int = 2,
                     python: Path | None = None) -> npt.NDArray[np.float32]:
    """llama.cpp's logits after each sequence of token ids (one batch each), computed
    twice: ``[0]`` as llama.cpp runs by default on this CPU, with its repacked weight
    layouts and their kernels (``use_extra_bufts``), ``[1]`` without them, through
    ggml's plain dot products. Both are llama.cpp's own arithmetic on the same file; how
    far they differ is how far rounding alone moves its logits there.
    ``float32 [2, len(sequences), vocab]``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "logits.npy"
        done = subprocess.run(
            [str(python or reference_python()), "-c", _LOGITS, str(path), str(threads),
             str(out), json.dumps(sequences)],
            capture_output=True, text=True, timeout=1800, check=False)
        if done.returncode != 0 or not out.is_file():
            raise RuntimeError(f"llama.cpp on {path} failed: {done.stderr.strip()[-2000:]}")
        rows: npt.NDArray[np.float32] = np.load(out)
    return rows


def main() -> int:
    """`just quants`: make every file (module doc) that is missing; print each one. Also
    llama.cpp's tokenizer test files (`tests/model/llama_cpp_vocab.py`)."""
    from tests.model.llama_cpp_vocab import fetch_vocabs

    print(f"vocab   {fetch_vocabs()} (llama.cpp's tokenizer tests)")
    why_not = reference_ready()
    if why_not is not None:
        print(f"just quants: {why_not}")
        return 2
    for kind in QUANT_KINDS:
        path = ensure_quant(kind)
        print(f"{kind:7s} {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
