"""swactor benchmarks: one module per subject, run as ``python -m bench [NAME ...]``."""
