"""llama.cpp's own tokenizer test files, taken from its source package on the package index.

Not a pytest module: the helper behind `tests/model/test_llama_cpp_vocab.py` and `just
quants`. llama.cpp keeps, for each tokenizer it supports, a vocabulary-only GGUF of the
real model's tokenizer (`models/ggml-vocab-NAME.gguf`: the header, hyperparameters and
tokenizer of e.g. Qwen2, no tensors) and its tokenizer test: strings
(`ggml-vocab-NAME.gguf.inp`, separated by `__ggml_vocab_test__` lines) and the ids
llama.cpp gives each, without BOS (`.out`, one line of ids per string). They ship inside
llama-cpp-python's source distribution (its `vendor/llama.cpp`), so `fetch_vocabs`
downloads that archive once with pip (`pip download --no-binary :all: --no-deps`, the
version the reference venv runs, else `VERSION`) and keeps the files of `VOCABS` under
`<model cache>/llama.cpp-vocab/`. No weights are downloaded: the files hold tokenizers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from swactor.model.paths import model_cache_dir
from tests.model.llama_cpp_quants import reference_python

VOCABS = ("qwen2", "llama-bpe", "llama-spm", "gpt-2", "phi-3", "refact", "starcoder")
"""The vocabularies of llama.cpp's tests whose tokenizer model and pre-tokenizer we support
(`qwen2`: Qwen2's own tokenizer file, architecture `qwen2`)."""
VERSION = "0.3.36"
SEPARATOR = "\n__ggml_vocab_test__\n"


def vocab_dir() -> Path:
    return model_cache_dir() / "llama.cpp-vocab"


def vocab_path(name: str) -> Path:
    return vocab_dir() / f"ggml-vocab-{name}.gguf"


def vocab_cases(name: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's test strings for `name` and the ids it expects for each (no BOS)."""
    path = vocab_path(name)
    texts = Path(f"{path}.inp").read_text(encoding="utf-8").split(SEPARATOR)
    lines = Path(f"{path}.out").read_text(encoding="utf-8").split("\n")
    if texts and texts[-1] == "":  # the file ends with a separator
        texts.pop()
    lines = lines[: len(texts)]
    if len(lines) != len(texts):
        raise ValueError(f"{path}: {len(texts)} test strings but {len(lines)} id lines")
    return [(text, [int(x) for x in line.split()]) for text, line in zip(texts, lines,
                                                                          strict=True)]


def missing() -> list[str]:
    """The names of `VOCABS` whose three files are not all in the cache."""
    return [name for name in VOCABS
            if not all(Path(f"{vocab_path(name)}{ext}").is_file() for ext in ("", ".inp", ".out"))]


def _version() -> str:
    python = reference_python()
    if python.is_file():
        done = subprocess.run([str(python), "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                              capture_output=True, text=True, timeout=120, check=False)
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
    return VERSION


def fetch_vocabs() -> Path:
    """Download llama-cpp-python's source archive and keep `VOCABS`' files (module doc)."""
    if not missing():
        return vocab_dir()
    version = _version()
    with tempfile.TemporaryDirectory(prefix="swactor-vocab-") as tmp:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--no-binary", ":all:", "--dest", tmp, f"llama-cpp-python=={version}"],
            capture_output=True, text=True, timeout=1800, check=False)
        archives = list(Path(tmp).glob("*.tar.gz"))
        if done.returncode != 0 or len(archives) != 1:
            raise RuntimeError(f"pip could not download llama-cpp-python {version}'s source "
                               f"(exit {done.returncode}): {done.stderr.strip()[-1000:]}")
        wanted = {f"ggml-vocab-{name}.gguf{ext}" for name in VOCABS
                  for ext in ("", ".inp", ".out")}
        target = vocab_dir()
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archives[0]) as archive:
            for member in archive:
                name = member.name.rsplit("/", 1)[-1]
                if (name not in wanted or "/vendor/llama.cpp/models/" not in member.name
                        or not member.isfile()):
                    continue
                source = archive.extractfile(member)
                assert source is not None
                part = target / f".{name}.part-{os.getpid()}"
                with source, part.open("wb") as out:
                    shutil.copyfileobj(source, out)
                os.replace(part, target / name)
    still = missing()
    if still:
        raise RuntimeError(f"llama-cpp-python {version}'s source has no vocabulary "
                           f"files for {', '.join(still)}")
    return vocab_dir()
