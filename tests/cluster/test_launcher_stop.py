"""`LocalCluster.stop` is bounded even when asyncio never hears of a node's exit: a real
child that ignores SIGTERM, behind a process handle whose `wait()` never returns (the
exit report lost)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest

from swactor.cluster import launcher
from swactor.cluster.launcher import LocalCluster, NodeProcess

IGNORES_SIGTERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " \
    "print('ready', flush=True); time.sleep(120)"


class _DeafHandle:
    """A process handle that signals the real child but never reports its exit."""

    def __init__(self, child: subprocess.Popen[bytes]) -> None:
        self.pid = child.pid
        self.returncode: int | None = None
        self._child = child

    def send_signal(self, signum: int) -> None:
        self._child.send_signal(signum)

    async def wait(self) -> int:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def test_stop_kills_a_deaf_node_and_returns_within_its_bounds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(launcher, "STOP_TIMEOUT_S", 0.3)
    child = subprocess.Popen([sys.executable, "-c", IGNORES_SIGTERM],
                             stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"

        async def scenario() -> list[int | None]:
            cluster = LocalCluster(1, tmp_path)
            cluster.nodes.append(NodeProcess(
                0, cast(asyncio.subprocess.Process, _DeafHandle(child))))
            return await asyncio.wait_for(cluster.stop(), 10)

        assert asyncio.run(scenario()) == [None]
        assert child.wait(10) == -signal.SIGKILL  # SIGTERM ignored, then killed
        assert f"node 0 (pid {child.pid}) did not report its exit" in capsys.readouterr().err
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
