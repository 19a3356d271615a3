"""Newline-delimited JSON control lines: one typed wire message per line.

Theory of operation
-------------------
The worker I/O adapter (spec §28) carries one message per line, commands on the
worker's stdin and events on its stdout. A line is the compact JSON object
`{"type": <class name>, "body": <message.to_json()>}` followed by `\\n`. Decoding is
strict and total: a line that is too long, not UTF-8 JSON (or nested too deeply for the
parser), not an object of exactly the keys `type` and `body`, or of a type the registry
does not list raises `ControlMessageError`; a known type whose body breaks a rule raises
that body's own `WireError`. Nothing else escapes, and no message quotes the line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from swactor.wire.codec import WireStruct
from swactor.wire.errors import ControlMessageError

MAX_CONTROL_LINE = 1 << 20


def registry_of(*message_types: type[WireStruct]) -> dict[str, type[WireStruct]]:
    """The `decode_line` registry of `message_types`: each under its class name, the
    name `encode_line` writes."""
    return {cls.__name__: cls for cls in message_types}


def encode_line(message: WireStruct) -> str:
    """One control line (ending in a newline) for `message`."""
    document = {"type": type(message).__name__, "body": message.to_json()}
    return json.dumps(document, separators=(",", ":"), allow_nan=False) + "\n"


def decode_line(
    line: str | bytes, registry: Mapping[str, type[WireStruct]], what: str
) -> WireStruct:
    """Parse one line into a message of a type named in `registry`; `what` names the kind."""
    if len(line) > MAX_CONTROL_LINE:
        raise ControlMessageError(what, "", f"line longer than {MAX_CONTROL_LINE} bytes")
    try:
        document = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ControlMessageError(what, "", f"not JSON ({exc.msg})") from None
    except (ValueError, UnicodeDecodeError):
        raise ControlMessageError(what, "", "not UTF-8 JSON") from None
    except RecursionError:
        raise ControlMessageError(what, "", "JSON nests too deeply") from None
    if not isinstance(document, dict) or set(document) != {"type", "body"}:
        raise ControlMessageError(what, "", "expected an object {type, body}")
    name = document["type"]
    message_type = registry.get(name) if isinstance(name, str) else None
    if message_type is None:
        raise ControlMessageError(what, "type", f"unknown {what} type")
    return message_type.from_json(document["body"])
