"""Generated modules and tests are lint- and type-clean as written, for every feature.

The fixture tables cover guards, wildcards, list rows, both ignore lists, the three
policies, timers (context and numeric), a non-terminal fault state, ``assign``, ``with``
literals (builtin and enum) and wire-typed, tuple and optional fields. Their generated
code must pass ``ruff`` (the project's rules) and ``mypy --strict`` with no formatter run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from codegen.__main__ import main

GOOD = Path(__file__).parent / "fixtures" / "good"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def out_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("generated")
    assert main(["--fsm-dir", str(GOOD), "--out-root", str(root)]) == 0
    return root


def test_generated_code_is_ruff_clean(out_root: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--line-length", "100",
         "--target-version", "py311", "--select", "E,F,W,I,UP,B",
         "--config", 'lint.isort.known-first-party = ["swactor", "codegen"]', "."],
        cwd=out_root, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout


def test_generated_modules_are_mypy_strict_clean(out_root: Path) -> None:
    env = dict(os.environ, MYPYPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
         "--cache-dir", os.devnull, "swactor/fsm/generated"],
        cwd=out_root, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout
