"""`python -m bench`: words after a benchmark's name are that benchmark's options."""

from __future__ import annotations

import pytest

from bench.__main__ import main, split_groups

NAMES = ["model", "quic", "report"]


def test_options_follow_their_benchmark() -> None:
    assert split_groups(["quic", "--repeat", "3", "model", "--beam", "2"], NAMES) == [
        ("quic", ["--repeat", "3"]),
        ("model", ["--beam", "2"]),
    ]


def test_an_option_before_any_name_is_refused() -> None:
    with pytest.raises(ValueError, match="--repeat"):
        split_groups(["--repeat", "3", "quic"], NAMES)


def test_unknown_name_exits_2_and_names_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["no-such-bench"]) == 2
    assert "unknown benchmark no-such-bench" in capsys.readouterr().err


def test_a_benchmark_refuses_an_option_it_does_not_have() -> None:
    with pytest.raises(SystemExit) as exited:
        main(["wire", "--no-such-option"])
    assert exited.value.code == 2
