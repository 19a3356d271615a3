"""Build hook for the native ring helper; all other metadata lives in pyproject.toml.

cffi compiles `native/ring.c` into `swactor.ring._ring_cffi` and `native/quicfast.c` into
`swactor.transport._quicfast_cffi` (API mode, the latter linked with libcrypto) whenever the
package is installed, editable installs included.
"""

from setuptools import setup  # type: ignore[import-untyped]

setup(cffi_modules=["native/ring_build.py:ffibuilder", "native/quicfast_build.py:ffibuilder"])
