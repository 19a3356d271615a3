"""llama.cpp's pre-tokenizer presets for byte-level BPE, as Hugging Face pre-tokenizers.

Theory of operation: a byte-level BPE model never merges across the pieces its
pre-tokenizer cuts the text into, so the cut decides the ids as much as the merges do.
A GGUF file names its cut in ``tokenizer.ggml.pre``; llama.cpp maps each name to an
ordered list of regular expressions and applies them one after another, every expression
splitting each piece the previous one left, and keeping both the matches and the text
between them as pieces. That is exactly a ``Sequence`` of ``Split(pattern, "isolated")``
pre-tokenizers in the ``tokenizers`` library, followed by the GPT-2 byte-to-unicode map
(``ByteLevel`` without its own regex). The expressions below are the published ones for
each preset (GPT-2's, Llama 3's and Qwen2's), written for Oniguruma, which understands
``\\p{L}``, ``\\p{N}``, ``(?i:...)`` and lookahead.

Each preset also carries llama.cpp's ``ignore_merges`` switch (Llama 3: a word that is
already one vocabulary entry skips the merges), and :data:`PRESETS` lists the names
llama.cpp treats alike. A name not listed there is refused with a typed error rather than
tokenized with a guess.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Regex, pre_tokenizers

from swactor.model.tokenizer_errors import TokenizerError, TokenizerFault

# GPT-2: contractions, optional space + letters, optional space + numbers, optional
# space + other symbols, and runs of whitespace not followed by a non-space.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"

# Llama 3: case-insensitive contractions, one non-letter/non-digit glued before letters,
# numbers in groups of at most three digits, symbols with trailing newlines, newline runs.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen2: as Llama 3 but every digit is its own piece.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# One digit per piece, applied before GPT-2's expression (StarCoder, SmolLM).
DIGIT_PATTERN = r"\p{N}"


@dataclass(frozen=True)
class PreTokenizerPreset:
    """One llama.cpp pre-tokenizer: its expressions, applied in order, and its switches."""

    name: str
    patterns: tuple[str, ...]
    ignore_merges: bool = False

    def build(self) -> pre_tokenizers.PreTokenizer:
        """The ``tokenizers`` pre-tokenizer that cuts text as llama.cpp does."""
        steps: list[pre_tokenizers.PreTokenizer] = [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated") for pattern in self.patterns
        ]
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
        return pre_tokenizers.Sequence(steps)


_GPT2 = PreTokenizerPreset("gpt-2", (GPT2_PATTERN,))
_SMOLLM = PreTokenizerPreset("smollm", (DIGIT_PATTERN, GPT2_PATTERN))
_LLAMA3 = PreTokenizerPreset("llama-bpe", (LLAMA3_PATTERN,), ignore_merges=True)
_QWEN2 = PreTokenizerPreset("qwen2", (QWEN2_PATTERN,))

# ``tokenizer.ggml.pre`` values and the preset llama.cpp uses for each.
PRESETS: dict[str, PreTokenizerPreset] = {
    "gpt-2": _GPT2,
    "phi-2": _GPT2,
    "smollm": _SMOLLM,
    "starcoder": _SMOLLM,
    "refact": _SMOLLM,
    "llama-bpe": _LLAMA3,
    "llama3": _LLAMA3,
    "llama-v3": _LLAMA3,
    "qwen2": _QWEN2,
    "deepseek-r1-qwen": _QWEN2,
    "stablelm2": _QWEN2,
}


def preset_for(pre: str | None, source: str) -> PreTokenizerPreset:
    """The preset named by ``tokenizer.ggml.pre``; a missing or unknown name is an error."""
    if pre is None:
        raise TokenizerError(
            TokenizerFault.UnsupportedPreTokenizer,
            f"{source}: gpt2 tokenizer without tokenizer.ggml.pre; supported: "
            + ", ".join(sorted(PRESETS)),
        )
    preset = PRESETS.get(pre)
    if preset is None:
        raise TokenizerError(
            TokenizerFault.UnsupportedPreTokenizer,
            f"{source}: pre-tokenizer {pre!r} is not supported; supported: "
            + ", ".join(sorted(PRESETS)),
        )
    return preset
