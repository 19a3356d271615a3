"""Helpers for tests that build a kernel's C for several x86-64 targets: the CPU's flags
(which targets this machine runs) and the build of one C function as a shared library
with tinygrad's own clang options plus a target's."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path


def cpu_flags() -> set[str]:
    """The CPU flags ``/proc/cpuinfo`` lists (empty where it cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return next((set(line.split(":", 1)[1].split()) for line in text.splitlines()
                 if line.startswith("flags")), set())


def build(source: str, name: str, flags: list[str], where: Path) -> ctypes.CDLL:
    """``source`` (C defining a function) in a shared library ``where/name.so`` built
    with ``flags`` (tinygrad's own clang options otherwise)."""
    library = where / f"{name}.so"
    subprocess.run(["clang", "-shared", "-x", "c", "-O2", "-fPIC", "-ffreestanding",
                    "-fno-math-errno", "-nostdlib", *flags, "-", "-o", str(library)],
                   input=source.encode(), check=True)
    return ctypes.CDLL(str(library))
