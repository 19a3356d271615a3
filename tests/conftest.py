"""Suite-wide pytest options: `--skip-slow` skips real-model and multi-host tests."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--skip-slow",
        action="store_true",
        default=False,
        help="skip tests marked slow (real model) or multihost (network namespaces)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--skip-slow"):
        return
    skip = pytest.mark.skip(reason="--skip-slow given")
    for item in items:
        if "slow" in item.keywords or "multihost" in item.keywords:
            item.add_marker(skip)
