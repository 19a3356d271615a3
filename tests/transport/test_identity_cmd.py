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


def _node(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "swactor.cli", "node", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_node_show_id_creates_the_key_and_prints_the_same_id_as_node_id(
    tmp_path: Path,
) -> None:
    key = tmp_path / "keys" / "node.key"
    shown = _node("--key", str(key), "--show-id")
    assert shown.returncode == 0, shown.stderr
    assert (key.stat().st_mode & 0o777) == 0o600
    node_id = NodeIdentity.load(key).node_id
    assert shown.stdout.split()[0] == f"{node_id:016x}"
    assert shown.stdout.split()[1] == f"({node_id})"
    # the key is reused, not replaced: node-id reports the same id
    assert _run("--key", str(key)).stdout.split()[0] == f"{node_id:016x}"
    assert _node("--key", str(key), "--show-id").stdout == shown.stdout


def test_node_without_show_id_still_needs_the_trusted_orchestrator(tmp_path: Path) -> None:
    key = tmp_path / "node.key"
    result = _node("--key", str(key))
    assert result.returncode == 2
    assert "error:" in result.stderr and "--trust-orchestrator" in result.stderr
    assert "Traceback" not in result.stderr
    assert not key.exists()  # refused before anything was created
