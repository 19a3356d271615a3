"""OpenAI request bodies, checked: every field named, typed and bounded before use.

Theory of operation: a request body is untrusted JSON, already bounded in size by the
server. :func:`parse_completion` and :func:`parse_chat` walk it field by field against
the fields OpenAI's API defines for the endpoint; a field we do not know, a value of the
wrong type or out of range, or an option this server cannot honour (``n > 1``, penalties,
logprobs) is an :class:`ApiError` with HTTP 400 in OpenAI's error shape, naming the field
in ``param``. Nothing here looks at the model: the prompt's length in tokens is checked by
the server after tokenizing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

MAX_STOPS = 4
"""OpenAI's bound on ``stop`` strings."""
MAX_STOP_CHARS = 256
MAX_MESSAGES = 4096
MAX_SEED = (1 << 63) - 1


class ApiError(Exception):
    """An answer in OpenAI's error shape: ``{"error": {message, type, param, code}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code

    def body(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


def bad(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


@dataclass(frozen=True)
class Options:
    """The sampling and streaming fields both endpoints share, checked."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False


@dataclass(frozen=True)
class GenerationRequest:
    """A checked completion or chat request (exactly one of the prompt forms is set)."""

    chat: bool
    prompt_text: str | None
    prompt_ids: tuple[int, ...] | None
    messages: tuple[dict[str, str], ...] | None
    options: Options


def parse_json_object(body: bytes) -> dict[str, object]:
    """The body as a JSON object, or a 400 naming why not."""
    try:
        value = json.loads(body.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise bad("request body is not UTF-8", code="invalid_json") from None
    except RecursionError:
        raise bad("request body nests too deeply", code="invalid_json") from None
    except ValueError as exc:
        raise bad(f"request body is not valid JSON ({exc})", code="invalid_json") from None
    if not isinstance(value, dict):
        raise bad("request body must be a JSON object", code="invalid_json")
    return value


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


# ------------------------------------------------------------------- field checkers


def _int(value: object, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"'{name}' must be an integer", name, "invalid_type")
    if not low <= value <= high:
        raise bad(f"'{name}' must be between {low} and {high}, got {value}", name)
    return value


def _number(value: object, name: str, low: float, high: float, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad(f"'{name}' must be a number", name, "invalid_type")
    number = float(value)
    if not math.isfinite(number) or number > high or number < low or (
        low_open and number == low
    ):
        opening = "(" if low_open else "["
        raise bad(f"'{name}' must be in {opening}{low}, {high}], got {value}", name)
    return number


def _bool(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise bad(f"'{name}' must be a boolean", name, "invalid_type")
    return value


def _str(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise bad(f"'{name}' must be a string", name, "invalid_type")
    return value


def _stop(value: object) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad("'stop' must be a string or a list of strings", "stop", "invalid_type")
    if len(stops) > MAX_STOPS:
        raise bad(f"'stop' takes at most {MAX_STOPS} strings, got {len(stops)}", "stop")
    for s in stops:
        if not s or len(s) > MAX_STOP_CHARS:
            raise bad(f"each 'stop' string must have 1 to {MAX_STOP_CHARS} characters", "stop")
    return tuple(stops)


def _unsupported(name: str, why: str) -> ApiError:
    return bad(f"'{name}' is not supported by this server: {why}", name, "unsupported_value")


def _zero_only(value: object, name: str) -> None:
    if _number(value, name, -2.0, 2.0) != 0.0:
        raise _unsupported(name, "only 0 is accepted")


def _one_only(value: object, name: str) -> None:
    if _int(value, name, 1, 128) != 1:
        raise _unsupported(name, "one choice per request (n=1)")


def _empty_only(value: object, name: str) -> None:
    if not isinstance(value, dict):
        raise bad(f"'{name}' must be an object", name, "invalid_type")
    if value:
        raise _unsupported(name, "only an empty object is accepted")


# ------------------------------------------------------------------------ requests

_Check = Callable[[object, str], None]

_IGNORED: dict[str, _Check] = {
    "model": lambda v, n: None if isinstance(v, str) else _fail_type(n, "a string"),
    "user": lambda v, n: None if isinstance(v, str) else _fail_type(n, "a string"),
    "n": _one_only,
    "presence_penalty": _zero_only,
    "frequency_penalty": _zero_only,
    "logit_bias": _empty_only,
}


def _fail_type(name: str, what: str) -> None:
    raise bad(f"'{name}' must be {what}", name, "invalid_type")


_COMMON = {
    "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options",
    *_IGNORED,
}
_COMPLETION_ONLY = {"prompt", "echo", "best_of", "suffix", "logprobs"}
_CHAT_ONLY = {"messages", "max_completion_tokens", "logprobs", "top_logprobs"}


def _common(body: Mapping[str, object], allowed: set[str], chat: bool) -> Options:
    for name in body:
        if name not in allowed:
            raise bad(
                f"Unrecognized request argument supplied: {name}", name, "unknown_parameter"
            )
    present = {k: v for k, v in body.items() if v is not None}
    for name, check in _IGNORED.items():
        if name in present:
            check(present[name], name)
    max_tokens: int | None = None
    if "max_tokens" in present:
        max_tokens = _int(present["max_tokens"], "max_tokens", 1, 1 << 31)
    if chat and "max_completion_tokens" in present:
        max_tokens = _int(present["max_completion_tokens"], "max_completion_tokens", 1, 1 << 31)
    stream = _bool(present["stream"], "stream") if "stream" in present else False
    include_usage = False
    if "stream_options" in present:
        options = present["stream_options"]
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise bad(
                "'stream_options' must be an object with only 'include_usage'",
                "stream_options", "invalid_type",
            )
        if not stream:
            raise bad("'stream_options' is only allowed with 'stream': true", "stream_options")
        include_usage = _bool(options.get("include_usage", False), "include_usage")
    return Options(
        max_tokens=max_tokens,
        temperature=(
            _number(present["temperature"], "temperature", 0.0, 2.0)
            if "temperature" in present else 1.0
        ),
        top_p=(
            _number(present["top_p"], "top_p", 0.0, 1.0, low_open=True)
            if "top_p" in present else 1.0
        ),
        seed=_int(present["seed"], "seed", 0, MAX_SEED) if "seed" in present else None,
        stop=_stop(present["stop"]) if "stop" in present else (),
        stream=stream,
        include_usage=include_usage,
    )


def parse_completion(body: Mapping[str, object]) -> GenerationRequest:
    """``POST /v1/completions``."""
    common = _common(body, _COMMON | _COMPLETION_ONLY, chat=False)
    if body.get("echo") not in (None, False):
        raise _unsupported("echo", "only false is accepted")
    if body.get("best_of") is not None:
        _one_only(body["best_of"], "best_of")
    if body.get("suffix") is not None:
        raise _unsupported("suffix", "insertion is not supported")
    if body.get("logprobs") not in (None, 0):
        raise _unsupported("logprobs", "log probabilities are not returned")
    prompt = body.get("prompt")
    text: str | None = None
    ids: tuple[int, ...] | None = None
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one prompt
    if isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, list) and prompt and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    ):
        ids = tuple(prompt)
    elif isinstance(prompt, list) and len(prompt) > 1 and all(
        isinstance(p, str | list) for p in prompt
    ):
        raise _unsupported("prompt", "one prompt per request")
    else:
        raise bad(
            "'prompt' must be a string or a non-empty list of token ids", "prompt",
            "invalid_type",
        )
    return GenerationRequest(
        chat=False, prompt_text=text, prompt_ids=ids, messages=None, options=common
    )


_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def _message(value: object, index: int) -> dict[str, str]:
    where = f"messages[{index}]"
    if not isinstance(value, dict):
        raise bad(f"'{where}' must be an object", where, "invalid_type")
    extra = set(value) - {"role", "content", "name"}
    if extra:
        raise bad(f"'{where}' has unsupported fields: {sorted(extra)}", where,
                  "unknown_parameter")
    role = value.get("role")
    if role not in _ROLES:
        raise bad(f"'{where}.role' must be one of {sorted(_ROLES)}", f"{where}.role")
    content = value.get("content")
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str) and set(part) == {"type", "text"}):
                raise bad(f"'{where}.content' parts must be text parts", f"{where}.content",
                          "invalid_type")
            parts.append(part["text"])
        content = "".join(parts)
    if not isinstance(content, str):
        raise bad(f"'{where}.content' must be a string", f"{where}.content", "invalid_type")
    if "name" in value:
        _str(value["name"], f"{where}.name")
    return {"role": _ROLES[role], "content": content}


def parse_chat(body: Mapping[str, object]) -> GenerationRequest:
    """``POST /v1/chat/completions``."""
    common = _common(body, _COMMON | _CHAT_ONLY, chat=True)
    if body.get("logprobs") not in (None, False):
        raise _unsupported("logprobs", "log probabilities are not returned")
    if body.get("top_logprobs") is not None:
        raise _unsupported("top_logprobs", "log probabilities are not returned")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list", "messages", "invalid_type")
    if len(messages) > MAX_MESSAGES:
        raise bad(f"'messages' holds at most {MAX_MESSAGES} messages", "messages")
    checked = tuple(_message(m, i) for i, m in enumerate(messages))
    return GenerationRequest(
        chat=True, prompt_text=None, prompt_ids=None, messages=checked, options=common
    )
