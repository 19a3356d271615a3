"""Printing commands whose reader has gone exit quietly with status 141 (`cli.main`).

Each command runs as a subprocess whose stdout is a pipe with its reading end already
closed, so its first write (or its last flush) meets EPIPE whatever the timing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from swactor.cli import EXIT_READER_GONE
from swactor.events import Emitted, NodeStarted
from swactor.model.paths import default_model_path
from swactor.wire import NodeId


def _events(tmp_path: Path) -> str:
    path = tmp_path / "node.jsonl"
    lines = [Emitted(NodeStarted(node_id=NodeId(n)), mono=n, wall=n, pid=1, proc="node")
             for n in range(1, 4)]
    path.write_text("".join(e.to_line() + "\n" for e in lines))
    return str(path)


COMMANDS = {
    "tokenize": lambda tmp: ["tokenize", "--model", str(default_model_path()), "hello world"],
    "plan": lambda tmp: ["plan", "--model", str(default_model_path()), "--nodes", "3"],
    "events": lambda tmp: ["events", _events(tmp)],
    "check": lambda tmp: ["check", _events(tmp)],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_closed_stdout_is_a_quiet_exit_141(command: str, tmp_path: Path) -> None:
    if command in ("tokenize", "plan") and not default_model_path().exists():
        pytest.fail(f"the model cache has no {default_model_path()} (run `just setup`)")
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([sys.executable, "-m", "swactor.cli",
                               *COMMANDS[command](tmp_path)],
                              stdout=write_end, stderr=subprocess.PIPE, timeout=120)
    finally:
        os.close(write_end)
    assert done.stderr.decode() == ""
    assert done.returncode == EXIT_READER_GONE == 141
