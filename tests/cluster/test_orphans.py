"""A LocalCluster's nodes (and their workers) die with the process that launched them.

A launcher process starts a one-node LocalCluster, prints its node's pid and waits; the
test finds every descendant of the launcher through /proc, SIGKILLs the launcher (as
when a test run is killed) and waits for each descendant to be gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LAUNCHER = """
import asyncio, json, sys
from pathlib import Path
from swactor.cluster.launcher import LocalCluster

async def main() -> None:
    cluster = LocalCluster(1, Path(sys.argv[1]), arena_ceiling="16MiB")
    await cluster.start()
    print(json.dumps([node.process.pid for node in cluster.nodes]), flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as listing:
                found += [int(word) for word in listing.read().split()]
    return found


def descendants(pid: int) -> list[int]:
    found = children(pid)
    for child in list(found):
        found += descendants(child)
    return found


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_nodes_and_workers_die_with_a_killed_launcher(tmp_path: Path) -> None:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path / "keys")],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    left: list[int] = []
    try:
        assert launcher.stdout is not None
        line = launcher.stdout.readline()
        assert line, f"the launcher ended: {launcher.communicate(timeout=30)[1][-2000:]}"
        (node,) = json.loads(line)
        left = descendants(launcher.pid)
        assert node in left and len(left) >= 2, "a node and its worker"
        launcher.kill()
        launcher.wait(timeout=30)
        deadline = time.monotonic() + 60
        while any(alive(pid) for pid in left) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [pid for pid in left if alive(pid)] == []
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for pid in left:  # without the fix: do not leave them running
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
