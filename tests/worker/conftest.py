"""Fixtures for the worker tests: a rig with a running, initialised worker."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from swactor.testing.worker_rig import WorkerRig


@pytest.fixture
def rig() -> Iterator[WorkerRig]:
    worker = WorkerRig()
    worker.initialize()
    try:
        yield worker
    finally:
        worker.close()
