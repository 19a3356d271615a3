"""Local clusters: N `swactor node` processes on loopback, for `swactor run` and tests."""
