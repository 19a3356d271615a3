"""Chat-template rendering: the GGUF's ``tokenizer.chat_template`` in a jinja2 sandbox.

Theory of operation: a chat template is a Jinja program shipped inside the model file, so
it is untrusted code. It runs in ``ImmutableSandboxedEnvironment`` (no attribute access to
internals, no mutation of the inputs), with the options and globals Hugging Face's
``apply_chat_template`` gives templates — ``trim_blocks``/``lstrip_blocks``, ``messages``,
``add_generation_prompt``, ``bos_token``, ``eos_token``, ``raise_exception``,
``strftime_now`` and a ``tojson`` filter — so templates written for it render the same
here. A template that does not parse, raises, or touches something the sandbox forbids is a
``ChatTemplateInvalid`` error naming the cause; the rendered prompt never appears in an
error.

Bounds (a template is a program from the model file): rendering stops with
``ChatTemplateInvalid`` once its output passes ``MAX_OUTPUT_CHARS`` (it is generated
piece by piece and counted as it comes) or it has run ``MAX_RENDER_S`` seconds: a trace
function in the rendering thread looks at the clock on each line the compiled template
executes, so a template that loops without output is stopped too. The sandbox's own
``range`` limit (100,000 items) still applies.
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import FrameType
from typing import Any, NoReturn

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from swactor.model.tokenizer_errors import TokenizerError, TokenizerFault

MAX_OUTPUT_CHARS = 1 << 20
"""Most characters a rendered prompt may have (far more than any context holds)."""
MAX_RENDER_S = 2.0
"""Most seconds a template may run."""


class _TooLong(Exception):
    """The template ran past `MAX_RENDER_S` (raised inside it by the trace function)."""


class _TemplateRaised(Exception):
    """What ``raise_exception(...)`` inside a template raises."""


def _raise_exception(message: str) -> NoReturn:
    raise _TemplateRaised(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def render_chat(
    template: str,
    messages: Sequence[Mapping[str, str]],
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
) -> str:
    """Render ``template`` for ``messages`` (``[{"role": ..., "content": ...}]``)."""
    env = _environment()
    try:
        compiled = env.from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise TokenizerError(
            TokenizerFault.ChatTemplateInvalid,
            f"chat template does not parse (line {exc.lineno}: {exc.message})",
        ) from exc
    deadline = time.monotonic() + MAX_RENDER_S
    try:
        return _bounded(compiled.generate(
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
        ), deadline)
    except _TooLong:
        raise TokenizerError(
            TokenizerFault.ChatTemplateInvalid,
            f"chat template ran longer than {MAX_RENDER_S} s",
        ) from None
    except _TemplateRaised as exc:
        raise TokenizerError(
            TokenizerFault.ChatTemplateInvalid, f"chat template refused the messages: {exc}"
        ) from exc
    except jinja2.TemplateError as exc:
        raise TokenizerError(
            TokenizerFault.ChatTemplateInvalid,
            f"chat template failed ({exc.__class__.__name__}: {exc.message})",
        ) from exc


def _bounded(pieces: Iterator[str], deadline: float) -> str:
    """Join the template's output pieces, within `MAX_OUTPUT_CHARS` and `deadline`."""

    def trace(frame: FrameType, event: str, arg: object) -> Callable[..., Any]:
        if time.monotonic() > deadline:
            raise _TooLong
        return trace

    out: list[str] = []
    total = 0
    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        for piece in pieces:
            total += len(piece)
            if total > MAX_OUTPUT_CHARS:
                raise TokenizerError(
                    TokenizerFault.ChatTemplateInvalid,
                    f"chat template output exceeds {MAX_OUTPUT_CHARS} characters",
                )
            out.append(piece)
    finally:
        sys.settrace(previous)
    return "".join(out)
