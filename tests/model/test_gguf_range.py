"""GGUF range reader: facts, stage tensor selection, plan validation and typed faults."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, quants

from swactor.model.errors import WeightsError, WeightsFault
from swactor.model.gguf_range import GgufRangeReader, coalesce_ranges, open_reader
from swactor.model.source import LocalFileSource
from tests.model.tiny_gguf import TinyConfig, write_tiny_gguf


def _reason(excinfo: pytest.ExceptionInfo[WeightsError]) -> WeightsFault:
    return excinfo.value.reason


def test_facts_come_from_metadata(tiny_llama: Path) -> None:
    facts = open_reader(tiny_llama).facts
    cfg = TinyConfig()
    assert facts.architecture == "llama"
    assert (facts.block_count, facts.hidden_dim, facts.ffn_dim) == (4, cfg.hidden, cfg.ffn)
    assert (facts.head_count, facts.head_count_kv, facts.head_dim) == (4, 2, 64)
    assert facts.rope_dim == 64 and facts.rope_theta == pytest.approx(cfg.rope_theta)
    assert facts.norm_eps == pytest.approx(cfg.eps)
    assert (facts.context_length, facts.vocab_size) == (cfg.context, cfg.vocab)
    assert (facts.bos_token_id, facts.eos_token_id) == (1, 2)
    assert facts.tied_embeddings


def test_stage_tensor_selection(tiny_mixed: Path) -> None:
    reader = open_reader(tiny_mixed)
    first = reader.stage_tensor_names(0, 2, is_first=True, is_last=False)
    middle = reader.stage_tensor_names(2, 4, is_first=False, is_last=False)
    last = reader.stage_tensor_names(4, 6, is_first=False, is_last=True)
    assert "token_embd.weight" in first and "output.weight" not in first
    assert {n.split(".")[1] for n in middle} == {"2", "3"}
    assert "output.weight" in last and "output_norm.weight" in last
    assert "token_embd.weight" not in last  # untied: the output projection is its own tensor
    assert len(first) == 1 + 2 * 9 and len(middle) == 18 and len(last) == 18 + 2


def test_tied_last_stage_reads_the_embedding(tiny_llama: Path) -> None:
    names = open_reader(tiny_llama).stage_tensor_names(2, 4, is_first=False, is_last=True)
    assert "token_embd.weight" in names


def test_loaded_tensors_equal_whole_file_dequantisation(tiny_mixed: Path) -> None:
    whole = {t.name: t for t in GGUFReader(str(tiny_mixed)).tensors}
    reader = open_reader(tiny_mixed)
    weights = reader.load_stage(2, 5, is_first=False, is_last=True, dtype="f32")
    assert set(weights.tensors) == set(
        reader.stage_tensor_names(2, 5, is_first=False, is_last=True)
    )
    for name, array in weights.tensors.items():
        t = whole[name]
        expected = quants.dequantize(t.data, t.tensor_type).reshape(array.shape)
        assert array.dtype == np.float32
        np.testing.assert_array_equal(array, expected.astype(np.float32), err_msg=name)
    half = reader.load_stage(2, 3, is_first=False, is_last=False, dtype="f16")
    assert all(a.dtype == np.float16 for a in half.tensors.values())


def test_bytes_read_cover_only_the_stage(tiny_mixed: Path) -> None:
    source = LocalFileSource(tiny_mixed)
    reader = GgufRangeReader(source)
    header = source.bytes_read
    assert header == reader.header_bytes and header < tiny_mixed.stat().st_size
    weights = reader.load_stage(2, 4, is_first=False, is_last=False)
    whole = {t.name: t for t in GGUFReader(str(tiny_mixed)).tensors}
    stage = [t for n, t in whole.items() if n.startswith(("blk.2.", "blk.3."))]
    stage_bytes = sum(int(t.n_bytes) for t in stage)
    assert weights.tensor_bytes == stage_bytes
    # coalescing may pull in alignment padding between tensors, never more than a page each
    assert stage_bytes <= weights.bytes_read <= stage_bytes + 4096 * len(weights.ranges)
    assert source.bytes_read == header + weights.bytes_read


def test_coalesce_ranges_merges_touching_spans() -> None:
    assert coalesce_ranges([(100, 10), (0, 50), (50, 50)]) == [(0, 110)]
    assert coalesce_ranges([(0, 10), (100_000, 10)]) == [(0, 10), (100_000, 10)]


@pytest.mark.parametrize(("start", "end"), [(3, 2), (0, 0), (-1, 2), (0, 5), (4, 9)])
def test_wrong_layer_range_is_typed(tiny_llama: Path, start: int, end: int) -> None:
    reader = open_reader(tiny_llama)
    with pytest.raises(WeightsError) as excinfo:
        reader.load_stage(start, end, is_first=False, is_last=False)
    assert _reason(excinfo) is WeightsFault.LayerRangeInvalid


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_layers": 5},
        {"hidden_dim": 128},
        {"max_seq_len": 65},
        {"max_seq_len": 0},
        {"dtype": "bf16"},
    ],
)
def test_plan_mismatch_is_typed(tiny_llama: Path, kwargs: dict[str, object]) -> None:
    reader = open_reader(tiny_llama)
    with pytest.raises(WeightsError) as excinfo:
        reader.load_stage(0, 2, is_first=True, is_last=False, **kwargs)  # type: ignore[arg-type]
    assert _reason(excinfo) is WeightsFault.PlanMismatch


def test_truncated_file_is_typed(tiny_llama: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    data = tiny_llama.read_bytes()
    cut.write_bytes(data[: len(data) - 1000])
    reader = open_reader(cut)  # the header is intact
    reader.load_stage(0, 1, is_first=True, is_last=False)  # early blocks are still there
    with pytest.raises(WeightsError) as excinfo:
        reader.load_stage(3, 4, is_first=False, is_last=True)
    assert _reason(excinfo) is WeightsFault.Truncated
    head_only = tmp_path / "head.gguf"
    head_only.write_bytes(data[:200])
    with pytest.raises(WeightsError) as excinfo:
        open_reader(head_only)
    assert _reason(excinfo) is WeightsFault.Truncated


def test_corrupt_header_is_typed(tiny_llama: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    data = bytearray(tiny_llama.read_bytes())
    data[0:4] = b"GGUX"
    bad.write_bytes(bytes(data))
    with pytest.raises(WeightsError) as excinfo:
        open_reader(bad)
    assert _reason(excinfo) is WeightsFault.CorruptHeader
    version = tmp_path / "version.gguf"
    data[0:8] = b"GGUF" + (99).to_bytes(4, "little")
    version.write_bytes(bytes(data))
    with pytest.raises(WeightsError) as excinfo:
        open_reader(version)
    assert _reason(excinfo) is WeightsFault.CorruptHeader


def test_missing_file_is_typed(tmp_path: Path) -> None:
    with pytest.raises(WeightsError) as excinfo:
        open_reader(tmp_path / "absent.gguf")
    assert _reason(excinfo) is WeightsFault.SourceInvalid


def test_unsupported_quantisation_is_typed(tmp_path: Path) -> None:
    # IQ4_NL is a real GGML type that this runtime does not accept
    path = write_tiny_gguf(tmp_path / "iq.gguf", TinyConfig(blocks=2, types_by_layer={}))
    data = bytearray(path.read_bytes())
    reader = GGUFReader(str(path))
    field = next(t for t in reader.tensors if t.name == "blk.1.ffn_up.weight").field
    type_offset = int(field.offset) + sum(int(p.nbytes) for p in field.parts[:4])
    data[type_offset : type_offset + 4] = int(Q.IQ4_NL).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    patched = open_reader(path)
    assert patched.tensors["blk.1.ffn_up.weight"].type_name == "IQ4_NL"
    patched.load_stage(0, 1, is_first=True, is_last=False)  # other stages are unaffected
    with pytest.raises(WeightsError) as excinfo:
        patched.load_stage(1, 2, is_first=False, is_last=True)
    assert _reason(excinfo) is WeightsFault.UnsupportedTensorType
    assert "blk.1.ffn_up.weight" in str(excinfo.value)


def test_unsupported_architecture_is_typed(tiny_llama: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.gguf"
    shutil.copy(tiny_llama, other)
    data = other.read_bytes().replace(b"llama", b"gemma")
    other.write_bytes(data)
    with pytest.raises(WeightsError) as excinfo:
        open_reader(other)
    assert _reason(excinfo) is WeightsFault.UnsupportedArchitecture


def test_a_stage_table_spares_the_second_reader_the_header(tiny_mixed: Path) -> None:
    """The node reads the header and hands the worker a stage table: the worker reads the
    stage's tensor bytes and nothing else, and loads what a header-reading load does."""

    node = GgufRangeReader(LocalFileSource(tiny_mixed))
    table = node.stage_table(node.validate_stage(2, 4, is_first=False, is_last=True))
    worker = GgufRangeReader(LocalFileSource(tiny_mixed), table)
    assert worker.source.bytes_read == 0 and worker.facts == node.facts
    loaded = worker.load_stage(2, 4, is_first=False, is_last=True)
    assert worker.source.bytes_read == sum(length for _, length in loaded.ranges)
    assert loaded.bytes_read < loaded.tensor_bytes + 4096 * len(loaded.ranges)
    reference = node.load_stage(2, 4, is_first=False, is_last=True)
    assert loaded.tensors.keys() == reference.tensors.keys()
    for name, array in reference.tensors.items():
        np.testing.assert_array_equal(loaded.tensors[name], array)
    with pytest.raises(WeightsError) as outside:  # a range the table does not cover
        worker.load_stage(0, 2, is_first=True, is_last=False)
    assert _reason(outside) is WeightsFault.MissingTensor


def test_a_stale_or_mangled_stage_table_is_typed(tiny_llama: Path) -> None:

    node = GgufRangeReader(LocalFileSource(tiny_llama))
    table = node.stage_table(node.validate_stage(0, 4, is_first=True, is_last=True))
    with pytest.raises(WeightsError) as stale:
        GgufRangeReader(LocalFileSource(tiny_llama), {**table, "file_size": 12})
    assert _reason(stale) is WeightsFault.SourceInvalid
    for mangled in ({**table, "tensors": [["x", 0]]}, {**table, "facts": {"a": 1}},
                    {"file_size": table["file_size"]}):
        with pytest.raises(WeightsError) as bad:
            GgufRangeReader(LocalFileSource(tiny_llama), mangled)
        assert _reason(bad) is WeightsFault.CorruptHeader
    past_end = [[*entry[:3], node.file_size, entry[4]] for entry in table["tensors"]]
    worker = GgufRangeReader(LocalFileSource(tiny_llama), {**table, "tensors": past_end})
    with pytest.raises(WeightsError) as truncated:
        worker.load_stage(0, 4, is_first=True, is_last=True)
    assert _reason(truncated) is WeightsFault.Truncated
