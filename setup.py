"""Build hook for the native ring helper; all other metadata lives in pyproject.toml.

cffi compiles `native/ring.c` into `swactor.ring._ring_cffi` (API mode) whenever the
package is installed, editable installs included.
"""

from setuptools import setup  # type: ignore[import-untyped]

setup(cffi_modules=["native/ring_build.py:ffibuilder"])
