"""The atheris harness of `just fuzz` (tests/faults/atheris_fuzz.py): it runs a target for
the inputs asked, reads libFuzzer's figures, and reports a crash with its input file.

atheris is an optional dependency (wheels for Linux x86_64 only): without it these tests
skip, and `just fuzz` falls back to Hypothesis.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.faults import atheris_fuzz

pytestmark = pytest.mark.skipif(not atheris_fuzz.atheris_available(),
                                reason="atheris is not installed (optional)")


@settings(database=None, deadline=None)
@given(st.binary(min_size=2))
def untyped_rejection(data: bytes) -> None:
    """A parser stand-in that rejects with a bare exception once its input starts 'Z'."""
    if data[:1] == b"Z":
        raise ValueError("not a typed rejection")


def test_a_target_runs_the_inputs_asked_without_a_crash(tmp_path: Path) -> None:
    result = atheris_fuzz.run_target("object_header", atheris_fuzz.TARGETS["object_header"],
                                     400, tmp_path)
    assert not result.crashed, result.detail
    assert result.inputs == 400
    assert result.rate > 0
    assert not list(tmp_path.glob("crash-*"))


def test_an_untyped_rejection_is_a_crash_with_its_input(tmp_path: Path) -> None:
    spec = f"{__name__}:untyped_rejection"
    result = atheris_fuzz.run_target("stand-in", spec, 200_000, tmp_path)
    assert result.crashed
    crashes = list(tmp_path.glob("crash-*"))
    assert crashes and str(crashes[0]) in result.detail
    assert "not a typed rejection" in result.detail
    assert result.inputs < 200_000  # it stopped at the crash


def test_stats_lines_are_read() -> None:
    text = "Done 5 runs\nstat::number_of_executed_units: 5\nstat::average_exec_per_sec: 9\n"
    assert atheris_fuzz.parse_stats(text) == {"number_of_executed_units": 5,
                                              "average_exec_per_sec": 9}


def test_an_unknown_target_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert atheris_fuzz.main(["no_such_parser", "--runs", "1"]) == 2
    assert "no_such_parser" in capsys.readouterr().err
