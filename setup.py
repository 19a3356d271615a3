"""Build hook for the native helpers; all other metadata lives in pyproject.toml.

cffi compiles `native/ring.c` into `swactor.ring._ring_cffi`, `native/quicfast.c` into
`swactor.transport._quicfast_cffi` (API mode, the latter linked with libcrypto) and
`native/replay.c` into `swactor.model._replay_cffi` (the CPU kernel replay pool) whenever
the package is installed, editable installs included.
"""

from setuptools import setup  # type: ignore[import-untyped]

setup(cffi_modules=["native/ring_build.py:ffibuilder", "native/quicfast_build.py:ffibuilder",
                   "native/replay_build.py:ffibuilder"])
