"""`swactor node --device` reaches the worker: the name is the tinygrad device it opens."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from swactor.worker.bridge import choose_device


def test_device_flag_reaches_the_worker(tmp_path: Path) -> None:
    """A device tinygrad has no backend for fails the worker's backend init, naming it
    (the default would have booted on the CPU)."""
    result = subprocess.run(
        [sys.executable, "-m", "swactor.cli", "node", "--key", str(tmp_path / "n.key"),
         "--trust-orchestrator", "1", "--open-pool", "--device", "nosuchdev",
         "--log-level", "INFO"],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode != 0
    assert "ops_nosuchdev" in result.stderr  # the worker tried to open NOSUCHDEV
    assert "boot failed: the GPU worker failed to start" in result.stderr


def test_choose_device_defaults_to_tinygrads_best() -> None:
    from tinygrad.device import Device

    assert choose_device(None) == Device.DEFAULT
    assert choose_device({"device": "auto"}) == Device.DEFAULT
    assert choose_device({"device": "cuda"}) == "CUDA"
