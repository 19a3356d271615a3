"""`swactor node --device` reaches the worker: the name is the tinygrad device it opens."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from swactor.worker.bridge import choose_device


def test_device_flag_reaches_the_worker(tmp_path: Path) -> None:
    """A device tinygrad has no backend for fails the worker's backend init, and the
    node's boot error names the worker's own account of it (the default would have
    booted on the CPU): at the default log level, where the worker's stderr is not
    echoed."""
    result = subprocess.run(
        [sys.executable, "-m", "swactor.cli", "node", "--key", str(tmp_path / "n.key"),
         "--trust-orchestrator", "1", "--open-pool", "--device", "nosuchdev"],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode != 0
    failure = [line for line in result.stderr.splitlines() if "boot failed" in line]
    assert len(failure) == 1, result.stderr
    assert "the GPU worker failed to start" in failure[0]
    assert "ops_nosuchdev" in failure[0]  # the worker tried to open NOSUCHDEV


def test_choose_device_defaults_to_tinygrads_best() -> None:
    from tinygrad.device import Device

    assert choose_device(None) == Device.DEFAULT
    assert choose_device({"device": "auto"}) == Device.DEFAULT
    assert choose_device({"device": "cuda"}) == "CUDA"
