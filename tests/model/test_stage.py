"""load_stage_role over HTTP and the byte form of step objects between two stages."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from swactor.model.artifact_server import ArtifactServer
from swactor.model.errors import WeightsError, WeightsFault
from swactor.model.llama_role import StageRole, StepError
from swactor.model.stage import LoadReport, input_from_bytes, load_stage_role, object_extent


def _load(location: str, start: int, end: int) -> tuple[StageRole, LoadReport]:
    return load_stage_role(
        location, layer_start=start, layer_end=end, is_first=start == 0, is_last=end == 4,
        dtype="f16", max_seq_len=16, num_layers=4, hidden_dim=256,
    )


def test_two_stages_over_http_exchange_bytes(tiny_llama: Path) -> None:
    with ArtifactServer(tiny_llama) as server:
        first, first_report = _load(server.url, 0, 2)
        last, last_report = _load(server.url, 2, 4)
        served = server.bytes_served
    size = tiny_llama.stat().st_size
    assert first_report.bytes_read + last_report.bytes_read == served
    assert first_report.file_size == size
    assert first_report.bytes_read - first_report.header_bytes >= first_report.tensor_bytes
    whole, _ = _load(str(tiny_llama), 0, 4)
    prompt = np.array([3, 1, 4, 1, 5], dtype=np.int32)
    payload = prompt.tobytes()
    for sequence in range(3):
        act = first.step(sequence, input_from_bytes(first, payload))
        wire = act.tobytes()
        assert len(wire) == object_extent(len(act), hidden_dim=256, dtype="f16", is_token=False)
        out = last.step(sequence, input_from_bytes(last, wire))
        expected = whole.step(sequence, input_from_bytes(whole, payload))
        assert out.tolist() == expected.tolist()
        payload = out.tobytes()
        assert len(payload) == object_extent(1, hidden_dim=256, dtype="f16", is_token=True)


def test_ragged_payload_is_a_step_error(tiny_llama: Path) -> None:
    role, _ = load_stage_role(
        tiny_llama, layer_start=1, layer_end=2, is_first=False, is_last=False,
        dtype="f32", max_seq_len=8,
    )
    with pytest.raises(StepError):
        input_from_bytes(role, b"\x00" * (256 * 4 + 2))
    with pytest.raises(StepError):
        input_from_bytes(role, b"")


def test_plan_checked_before_loading(tiny_llama: Path) -> None:
    with pytest.raises(WeightsError) as excinfo:
        load_stage_role(
            tiny_llama, layer_start=0, layer_end=2, is_first=True, is_last=False,
            dtype="f32", max_seq_len=8, num_layers=30,
        )
    assert excinfo.value.reason is WeightsFault.PlanMismatch
