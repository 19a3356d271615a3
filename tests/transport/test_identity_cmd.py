"""`swactor node-id` through the real CLI entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from swactor.transport.identity import NodeIdentity


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "swactor.cli", "node-id", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_prints_the_id_of_the_created_key(tmp_path: Path) -> None:
    key = tmp_path / "sub" / "node.key"
    first = _run("--key", str(key), "--json")
    assert first.returncode == 0, first.stderr
    shown = json.loads(first.stdout)
    assert shown["node_id"] == NodeIdentity.load(key).node_id
    assert shown["hex"] == f"{shown['node_id']:016x}"
    again = _run("--key", str(key))
    assert again.stdout.split()[0] == shown["hex"]


def test_readable_key_is_refused_with_exit_2(tmp_path: Path) -> None:
    key = tmp_path / "node.key"
    NodeIdentity.load_or_create(key)
    os.chmod(key, 0o644)
    result = _run("--key", str(key))
    assert result.returncode == 2
    assert "chmod 600" in result.stderr and "Traceback" not in result.stderr
