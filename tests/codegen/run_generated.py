"""Run generated conformance tests against machines generated into another root.

``python tests/codegen/run_generated.py ROOT [pytest args]`` puts
``ROOT/swactor/fsm/generated`` in front of the ``swactor.fsm.generated`` package path,
so that tests generated from fixture tables import their fixture machines, then runs
pytest. Used by ``test_generated_tests.py`` in a subprocess.
"""

from __future__ import annotations

import sys

import pytest

import swactor.fsm.generated as generated_package


def run(root: str, args: list[str]) -> int:
    generated_package.__path__ = [f"{root}/swactor/fsm/generated", *generated_package.__path__]
    return int(pytest.main(["-q", "-p", "no:cacheprovider", "--rootdir", root, *args]))


if __name__ == "__main__":
    sys.exit(run(sys.argv[1], sys.argv[2:]))
