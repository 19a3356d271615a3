"""``swactor tokenize``: print a model's token ids for a text, like llama.cpp's tool.

Theory of operation: the command builds the tokenizer from the GGUF's metadata (default:
the embedded SmolLM2, :func:`swactor.model.paths.default_model_path`), optionally wraps the
text in the file's chat template as one user message with the generation prompt, encodes
it (BOS as the file says unless ``--no-bos``; special-token texts parsed unless
``--no-special``) and prints one ``id -> 'piece'`` line per token, the id right-aligned in
six columns as ``llama-tokenize`` prints it, or ``{"ids": [...]}`` with ``--json``. A piece
that is only part of a UTF-8 character shows its bytes as ``\\xNN``. A tokenizer error
(missing or unreadable model, unsupported tokenizer, broken template) is one line on
stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from swactor.model.paths import default_model_path
from swactor.model.tokenizer_errors import TokenizerError

EXIT_TOKENIZER_ERROR = 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``tokenize`` subcommand."""
    parser = subparsers.add_parser(
        "tokenize",
        help="print the token ids of a text for a GGUF model",
        description="Tokenize TEXT with the tokenizer stored in a GGUF file's metadata.",
    )
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help=f"GGUF file (default: {default_model_path()})",
    )
    parser.add_argument("--json", action="store_true", help='print {"ids": [...]}')
    parser.add_argument(
        "--no-special",
        action="store_true",
        help="treat special-token texts such as <|im_start|> as plain text",
    )
    parser.add_argument("--no-bos", action="store_true", help="never add a BOS token")
    parser.add_argument(
        "--chat",
        action="store_true",
        help="render TEXT as one user message through the model's chat template first",
    )
    parser.add_argument("text", metavar="TEXT", help="the text to tokenize")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    # Imported here so that `swactor --help` does not load tokenizers, gguf and numpy.
    from swactor.model.tokenizer import Tokenizer

    model: Path = args.model if args.model is not None else default_model_path()
    try:
        tokenizer = Tokenizer.from_gguf(model)
        text: str = args.text
        if args.chat:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True
            )
        ids = tokenizer.encode(
            text,
            add_bos=False if args.no_bos else None,
            parse_special=not args.no_special,
        )
    except TokenizerError as exc:
        print(f"swactor tokenize: {exc}", file=sys.stderr)
        return EXIT_TOKENIZER_ERROR
    if args.json:
        print(json.dumps({"ids": ids}))
    else:
        for token_id in ids:
            piece = tokenizer.token_bytes(token_id).decode("utf-8", errors="backslashreplace")
            print(f"{token_id:6d} -> '{piece}'")
    return 0
