"""`python -m tests.faults.atheris_fuzz [--runs N] [TARGET ...]`: coverage-guided fuzz of
the parsers of outside input with atheris (libFuzzer), the fast path of `just fuzz`.

Theory of operation. The targets are the Hypothesis tests of `tests/faults/test_fuzz.py`
(object header, edge preamble, control decoder, worker JSON adapter both ends, GGUF
reader, YAML table loader, SWIM datagram decoder raw and with a validly signed body):
each accepts its input or rejects it with its own typed error, and anything else raises.
atheris drives a test through Hypothesis's `test.hypothesis.fuzz_one_input(buffer)`,
which reads the libFuzzer buffer as the test's draws and runs the body once, so both
fuzzers share one definition of "typed rejection" and one set of input shapes; libFuzzer
mutates the buffer, guided by the line coverage of the instrumented `swactor` and
`codegen` modules.

libFuzzer's loop never returns, so each target runs in a child process
(`--child SPEC`, SPEC = `module:function`) with `-runs=N`; the parent reads the child's
final stats (inputs executed, inputs/s) and its exit status. A crash (an exception that
is not a typed rejection, or a child killed by a signal) stops that target: libFuzzer
writes the input to `crash-*` in the artifact directory, which the table names. Exit
status: 0 when every target ran its N inputs without a crash, 1 otherwise, 2 when atheris
is not importable (`just fuzz` then runs the Hypothesis tests instead and says so).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TARGETS: dict[str, str] = {
    "object_header": "tests.faults.test_fuzz:test_object_header_parser",
    "edge_preamble": "tests.faults.test_fuzz:test_edge_preamble",
    "control_decoder": "tests.faults.test_fuzz:test_control_message_decoder",
    "worker_adapter_node": "tests.faults.test_fuzz:test_worker_adapter_node_end",
    "worker_adapter_worker": "tests.faults.test_fuzz:test_worker_adapter_worker_end",
    "gguf_reader": "tests.faults.test_fuzz:test_gguf_reader",
    "yaml_loader": "tests.faults.test_fuzz:test_yaml_table_loader",
    "yaml_loader_raw": "tests.faults.test_fuzz:test_yaml_table_loader_raw_bytes",
    "swim_datagram": "tests.faults.test_fuzz:test_swim_datagram_decoder",
    "swim_signed_body": "tests.faults.test_fuzz:test_swim_signed_body_decoder",
}
INSTRUMENTED = ["swactor", "codegen"]
MAX_LEN = 8192
STAT = re.compile(r"stat::(\w+):\s*(\d+)")


@dataclass
class TargetResult:
    """One target's run as the table shows it."""

    name: str
    inputs: int
    seconds: float
    crashed: bool
    detail: str

    @property
    def rate(self) -> float:
        return self.inputs / self.seconds if self.seconds > 0 else 0.0


def atheris_available() -> bool:
    try:
        importlib.import_module("atheris")
    except ImportError:
        return False
    return True


def _load(spec: str) -> Any:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def child(spec: str, runs: int, artifacts: Path) -> None:
    """Fuzz one target in this process (never returns: libFuzzer exits)."""
    import atheris  # type: ignore[import-untyped]

    with atheris.instrument_imports(include=INSTRUMENTED):
        test = _load(spec)
    one_input = test.hypothesis.fuzz_one_input
    argv = [sys.argv[0], f"-runs={runs}", f"-max_len={MAX_LEN}", "-print_final_stats=1",
            f"-artifact_prefix={artifacts}/", "-rss_limit_mb=4096", "-timeout=60"]
    atheris.Setup(argv, one_input)
    atheris.Fuzz()


def parse_stats(output: str) -> dict[str, int]:
    """libFuzzer's `stat::name: value` lines."""
    return {name: int(value) for name, value in STAT.findall(output)}


def crash_report(output: str) -> str:
    """The exception atheris printed (its traceback), else the output's last lines."""
    lines = [line for line in output.splitlines()
             if line.strip() and not line.startswith(("stat::", "INFO:", "WARNING:"))]
    for index, line in enumerate(lines):
        if "Uncaught Python exception" in line:
            return "\n".join(lines[index:index + 40])
    return "\n".join(lines[-12:])


def run_target(name: str, spec: str, runs: int, artifacts: Path) -> TargetResult:
    """Fuzz `spec` for `runs` inputs in a child process; what it did."""
    artifacts.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "tests.faults.atheris_fuzz", "--child", spec,
         "--runs", str(runs), "--artifacts", str(artifacts)],
        capture_output=True, text=True, errors="replace", check=False)
    seconds = time.monotonic() - started
    output = done.stdout + done.stderr
    stats = parse_stats(output)
    crashes = sorted(artifacts.glob("crash-*")) + sorted(artifacts.glob("timeout-*")) \
        + sorted(artifacts.glob("oom-*"))
    crashed = done.returncode != 0 or bool(crashes)
    detail = ""
    if crashed:
        where = f"input {crashes[0]}" if crashes else f"exit {done.returncode}"
        detail = f"{where}\n{crash_report(output)}"
    return TargetResult(name, stats.get("number_of_executed_units", 0), seconds, crashed,
                        detail)


def print_table(results: list[TargetResult]) -> None:
    print(f"{'target':<24} {'inputs':>9} {'seconds':>9} {'inputs/s':>9} {'crashes':>8}")
    for r in results:
        print(f"{r.name:<24} {r.inputs:>9} {r.seconds:>9.1f} {r.rate:>9.0f} "
              f"{int(r.crashed):>8}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.atheris_fuzz")
    parser.add_argument("targets", nargs="*", help=f"default: all of {', '.join(TARGETS)}")
    parser.add_argument("--runs", type=int, default=int(
        os.environ.get("SWACTOR_FUZZ_EXAMPLES", 100_000)))
    parser.add_argument("--artifacts", type=Path, default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not atheris_available():
        print("atheris is not importable", file=sys.stderr)
        return 2
    if args.child is not None:
        child(args.child, args.runs, args.artifacts)
        return 0  # not reached: libFuzzer exits
    unknown = [t for t in args.targets if t not in TARGETS and ":" not in t]
    if unknown:
        print(f"unknown fuzz target(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    names = args.targets or list(TARGETS)
    artifacts = args.artifacts or Path(tempfile.mkdtemp(prefix="swactor-atheris-"))
    results = []
    for name in names:
        spec = TARGETS.get(name, name)
        result = run_target(name, spec, args.runs, artifacts / name.replace(":", "_"))
        print(f"{name}: {result.inputs} inputs in {result.seconds:.1f} s"
              + (f"  CRASH {result.detail}" if result.crashed else ""), flush=True)
        results.append(result)
    print()
    print_table(results)
    print(f"artifacts: {artifacts}")
    return 1 if any(r.crashed or r.inputs < args.runs for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
