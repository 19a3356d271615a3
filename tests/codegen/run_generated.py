"""Run generated conformance tests against machines generated into another root.

``python tests/codegen/run_generated.py ROOT [pytest args]`` puts
``ROOT/swactor/fsm/generated`` in front of the ``swactor.fsm.generated`` package path,
so that tests generated from fixture tables import their fixture machines, then runs
pytest with Hypothesis's example database off. Used by ``test_generated_tests.py`` in a
subprocess.
"""

from __future__ import annotations

import sys

import pytest
from hypothesis import settings

import swactor.fsm.generated as generated_package


def run(root: str, args: list[str]) -> int:
    # no example database: every run must find failures from scratch, as on a fresh clone
    settings.register_profile("fresh", database=None)
    settings.load_profile("fresh")
    generated_package.__path__ = [f"{root}/swactor/fsm/generated", *generated_package.__path__]
    return int(pytest.main(["-q", "-p", "no:cacheprovider", "--rootdir", root, *args]))


if __name__ == "__main__":
    sys.exit(run(sys.argv[1], sys.argv[2:]))
