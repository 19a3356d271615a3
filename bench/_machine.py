"""What a benchmark report was measured on: machine, load, versions, commit, date.

Theory of operation: everything is read from the running system (`/proc`, `os`,
`importlib.metadata`, `git`), never configured; a fact that cannot be read is recorded as
None rather than guessed.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("tinygrad", "aioquic", "cryptography", "numpy", "gguf", "cffi", "py-spy",
            "llama_cpp_python")
ROOT = Path(__file__).resolve().parent.parent


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / (1 << 20)
    except (OSError, ValueError):
        pass
    return None


def _git(*args: str) -> str | None:
    try:
        result = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                                timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    """Machine, versions, commit and the UTC date, now."""
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S"),
        "host": platform.node(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "swactor_commit": _git("rev-parse", "--short", "HEAD"),
        "working_tree_modified": bool(dirty) if dirty is not None else None,
        "versions": {name: _version(name) for name in PACKAGES},
        "load_average": os.getloadavg(),
    }
