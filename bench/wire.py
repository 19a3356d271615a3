"""Wire codec costs: ObjectHeader pack/unpack against bare `struct`, plan JSON round trips.

Theory of operation: each figure is the best of several timed batches (`timeit`), all
measured in this one run, and printed with the ratio to its baseline: the validated
`ObjectHeader.unpack` (the per-object cost in the worker's ingress parser) against a
bare `struct.unpack_from`, and `RunPlan` JSON encode+decode against plain `json` on the
same document (the cost of strict decoding and validation on top of parsing).
"""

from __future__ import annotations

import argparse
import json
import struct
import timeit
from collections.abc import Callable

from swactor.testing.examples import example
from swactor.wire import (
    OBJECT_HEADER_FORMAT,
    EdgePreamble,
    GrantSteps,
    ObjectHeader,
    ObjectSpec,
    RunPlan,
    decode_command,
    encode_command,
)


def _best_us(fn: Callable[[], object], number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench wire",
        description="wire codec costs beside bare struct/json (no options).")
    parser.parse_args(argv)
    header = example(ObjectHeader)
    packed = header.pack()
    spec = example(ObjectSpec)
    raw = struct.Struct(OBJECT_HEADER_FORMAT)
    fields = raw.unpack(packed)
    plan = example(RunPlan)
    plan_text = json.dumps(plan.to_json())
    step = example(GrantSteps)
    step_line = encode_command(step)
    preamble = example(EdgePreamble).pack()

    rows: list[tuple[str, float, str, float]] = []

    def add(
        name: str, fn: Callable[[], object], base: str, base_fn: Callable[[], object], n: int
    ) -> None:
        rows.append((name, _best_us(fn, n), base, _best_us(base_fn, n)))

    add(
        "ObjectHeader.unpack",
        lambda: ObjectHeader.unpack(packed),
        "struct.unpack_from",
        lambda: raw.unpack_from(packed),
        20000,
    )
    add(
        "ObjectHeader.pack",
        header.pack,
        "struct.pack",
        lambda: raw.pack(*fields),
        20000,
    )
    add(
        "unpack + check_against",
        lambda: ObjectHeader.unpack(packed).check_against(spec),
        "struct.unpack_from",
        lambda: raw.unpack_from(packed),
        20000,
    )
    add(
        "EdgePreamble.unpack",
        lambda: EdgePreamble.unpack(preamble),
        "struct.unpack_from",
        lambda: struct.unpack_from("<4sHHQ", preamble),
        20000,
    )
    add(
        "RunPlan from_json(loads)",
        lambda: RunPlan.from_json(json.loads(plan_text)),
        "json.loads",
        lambda: json.loads(plan_text),
        500,
    )
    add(
        "RunPlan to_json+dumps",
        lambda: json.dumps(plan.to_json()),
        "json.dumps(dict)",
        lambda: json.dumps(json.loads(plan_text)),
        500,
    )
    add(
        "decode_command(GrantSteps)",
        lambda: decode_command(step_line),
        "json.loads",
        lambda: json.loads(step_line),
        5000,
    )

    print(f"{'operation':32} {'us/op':>9}   {'baseline':22} {'us/op':>9} {'ratio':>7}")
    for name, us, base, base_us in rows:
        print(f"{name:32} {us:9.2f}   {base:22} {base_us:9.2f} {us / base_us:7.1f}x")
    return 0
