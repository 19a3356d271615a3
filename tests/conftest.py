"""Suite-wide pytest options: `--skip-slow` skips real-model and multi-host tests;
`--shuffle SEED` runs the selected tests in an order drawn from SEED (tests must pass
in any selection and order; the seed is printed so that a failing order can be re-run).

The suite keeps its own kernel cache (`SWACTOR_KERNEL_CACHE`, a temporary directory for
the session, removed at its end) unless one is given: tests start from an empty cache
whatever earlier runs on the machine left, and the session's later workers replay what
its first ones built, as a user's runs do.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile

import pytest

_KERNEL_CACHE_ENV = "SWACTOR_KERNEL_CACHE"
_own_kernel_cache: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    if _KERNEL_CACHE_ENV not in os.environ:
        path = tempfile.mkdtemp(prefix="swactor-kernels-")
        _own_kernel_cache.append(path)
        os.environ[_KERNEL_CACHE_ENV] = path


def pytest_unconfigure(config: pytest.Config) -> None:
    for path in _own_kernel_cache:
        shutil.rmtree(path, ignore_errors=True)
        os.environ.pop(_KERNEL_CACHE_ENV, None)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--skip-slow",
        action="store_true",
        default=False,
        help="skip tests marked slow (real model) or multihost (network namespaces)",
    )
    parser.addoption(
        "--shuffle",
        type=int,
        default=None,
        metavar="SEED",
        help="run the selected tests in a random order drawn from SEED",
    )


def pytest_report_header(config: pytest.Config) -> str | None:
    seed = config.getoption("--shuffle")
    return None if seed is None else f"test order shuffled: --shuffle {seed}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seed = config.getoption("--shuffle")
    if seed is not None:
        random.Random(seed).shuffle(items)
    if not config.getoption("--skip-slow"):
        return
    skip = pytest.mark.skip(reason="--skip-slow given")
    for item in items:
        if "slow" in item.keywords or "multihost" in item.keywords:
            item.add_marker(skip)
