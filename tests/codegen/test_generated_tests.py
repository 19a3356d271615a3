"""The generated conformance tests pass on generated machines and catch broken ones.

The fixture tables are generated into a temporary root; their generated tests run in a
subprocess (``run_generated.py``) against the fixture machines. Then single hand-made
faults are planted in a generated module, one at a time, and the matrix/path tests and
the differential test must each fail on it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from codegen.__main__ import main

GOOD = Path(__file__).parent / "fixtures" / "good"
RUNNER = Path(__file__).parent / "run_generated.py"
REPO = Path(__file__).resolve().parents[2]

# (text in the generated lease_desk module, replacement): one planted fault each.
FAULTS = [
    pytest.param("(State.Ready, Close): ((None, State.Draining, _row_5),)",
                 "(State.Ready, Close): ((None, State.Ready, _row_5),)", id="wrong-target"),
    pytest.param("return [effect_0, _EFFECT_1]", "return [effect_0]", id="lost-cancel-timer"),
    pytest.param("_set_Granted_size(effect_0, event.size)",
                 "_set_Granted_size(effect_0, m._ceiling)", id="wrong-effect-field"),
    pytest.param("(_guard_fits_now, None, _row_1),\n        (_guard_can_ever_fit, None, _row_2),",
                 "(_guard_can_ever_fit, None, _row_2),\n        (_guard_fits_now, None, _row_1),",
                 id="guard-order"),
    pytest.param("    (State.Ready, Tick): _IGNORED,\n", "", id="lost-ignore"),
    pytest.param("    m._ceiling = event.ceiling\n", "", id="lost-assign"),
    pytest.param("        self._state = State.Failed\n"
                 "        self._events = _BY_STATE[State.Failed]\n", "", id="fault-policy-stays"),
]


@pytest.fixture(scope="module")
def generated_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("generated")
    assert main(["--fsm-dir", str(GOOD), "--out-root", str(root)]) == 0
    return root


def _run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(RUNNER), str(root), *args], cwd=REPO,
                          capture_output=True, text=True, check=False, timeout=300)


def test_generated_tests_pass_on_the_generated_machines(generated_root: Path) -> None:
    done = _run(generated_root, str(generated_root / "tests" / "generated"))
    assert done.returncode == 0, done.stdout[-3000:]
    assert " passed" in done.stdout and "failed" not in done.stdout


@pytest.mark.parametrize(("original", "planted"), FAULTS)
def test_planted_fault_is_caught(generated_root: Path, tmp_path: Path, original: str,
                                 planted: str) -> None:
    root = tmp_path / "root"
    shutil.copytree(generated_root, root)
    module = root / "swactor" / "fsm" / "generated" / "lease_desk.py"
    text = module.read_text(encoding="utf-8")
    assert text.count(original) == 1
    module.write_text(text.replace(original, planted), encoding="utf-8")
    done = _run(root, str(root / "tests" / "generated" / "test_lease_desk.py"), "-rf")
    assert done.returncode == 1, done.stdout[-3000:]
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
    assert any("::test_differential_against_transitions" in line for line in failed), failed
    assert any("::test_matrix" in line or "::test_path" in line for line in failed), failed
