"""The GGUF header parser against the `gguf` package's reader, and on hostile bytes."""

from __future__ import annotations

import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from swactor.model.gguf_header import (
    GgufHeaderError,
    NeedMoreBytes,
    parse_header,
    read_local_header,
)
from swactor.model.gguf_range import open_reader
from swactor.model.paths import default_model_path


def _reference(path: Path) -> tuple[dict[str, Any], list[tuple[str, tuple[int, ...], int, int]],
                                     int]:
    reader = gguf.GGUFReader(path)
    metadata = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = [(t.name, tuple(int(d) for d in t.shape), int(t.tensor_type),
                int(t.data_offset) - int(reader.data_offset)) for t in reader.tensors]
    return metadata, tensors, int(reader.data_offset)


def _assert_same_as_reference(path: Path) -> None:
    metadata, tensors, data_offset = _reference(path)
    header, _ = read_local_header(path)
    assert header.metadata == metadata
    assert {k: type(v) for k, v in header.metadata.items()} == {
        k: type(v) for k, v in metadata.items()}
    assert [(t.name, t.dims, t.type_id, t.offset) for t in header.tensors] == tensors
    assert header.data_offset == data_offset


def _write(path: Path, endian: gguf.GGUFEndian = gguf.GGUFEndian.LITTLE) -> Path:
    writer = gguf.GGUFWriter(path, "llama", endianess=endian)
    writer.add_uint8("t.u8", 7)
    writer.add_int8("t.i8", -7)
    writer.add_uint16("t.u16", 700)
    writer.add_int16("t.i16", -700)
    writer.add_uint32("t.u32", 70000)
    writer.add_int32("t.i32", -70000)
    writer.add_float32("t.f32", 0.25)
    writer.add_uint64("t.u64", 1 << 40)
    writer.add_int64("t.i64", -(1 << 40))
    writer.add_float64("t.f64", 1e-300)
    writer.add_bool("t.bool", True)
    writer.add_string("t.str", "héllo")
    writer.add_array("t.ints", [1, -2, 3])
    writer.add_array("t.floats", [0.5, -1.5])
    writer.add_array("t.bools", [True, False, True])
    writer.add_array("t.strs", ["a", "", "Ġworld", "▁x"])
    writer.add_array("t.empty", [])
    writer.add_token_list([f"tok{i}" for i in range(300)])
    writer.add_tensor("a.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.add_tensor("b.weight", np.ones((2, 3, 5), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("endian", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_every_value_type_reads_as_the_gguf_reader_reads_it(
        tmp_path: Path, endian: gguf.GGUFEndian) -> None:
    path = _write(tmp_path / "all.gguf", endian)
    _assert_same_as_reference(path)
    header, _ = read_local_header(path)
    assert header.metadata["t.strs"] == ["a", "", "Ġworld", "▁x"]
    assert header.metadata["t.bools"] == [True, False, True]


@pytest.mark.slow  # the real model file
def test_smollm2_header_reads_as_the_gguf_reader_reads_it() -> None:
    _assert_same_as_reference(default_model_path())


def test_every_prefix_short_of_the_header_asks_for_more(tmp_path: Path) -> None:
    data = _write(tmp_path / "all.gguf").read_bytes()
    end = parse_header(data).header_bytes
    for cut in range(0, end, 7):
        with pytest.raises(NeedMoreBytes) as more:
            parse_header(data[:cut])
        assert cut < more.value.end <= end
        assert more.value.estimate >= more.value.end
    assert parse_header(data[:end]).header_bytes == end


@pytest.mark.slow  # the real model file
def test_range_reader_reads_the_header_and_little_more() -> None:
    reader = open_reader(default_model_path())
    header, _ = read_local_header(default_model_path())
    assert header.header_bytes <= reader.header_bytes <= header.header_bytes * 1.05


def _kv_header(kv: bytes, count: int = 1, tensors: int = 0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, tensors, count) + kv


def _key(name: str) -> bytes:
    raw = name.encode()
    return struct.pack("<Q", len(raw)) + raw


def test_a_huge_array_count_costs_nothing_before_the_bytes_exist() -> None:
    # 2**60 strings: the parser must ask for the bytes, not loop or allocate
    data = _kv_header(_key("k") + struct.pack("<IIQ", 9, 8, 1 << 60))
    started = time.perf_counter()
    with pytest.raises(NeedMoreBytes) as more:
        parse_header(data)
    assert more.value.end >= 1 << 63
    for element in (4, 9):  # u32 elements, nested arrays
        with pytest.raises(NeedMoreBytes):
            parse_header(_kv_header(_key("k") + struct.pack("<IIQ", 9, element, 1 << 60)))
    with pytest.raises(NeedMoreBytes):  # 2**60 keys
        parse_header(_kv_header(b"", count=1 << 60))
    with pytest.raises(NeedMoreBytes):  # a 2**60-byte key
        parse_header(_kv_header(struct.pack("<Q", 1 << 60)))
    assert time.perf_counter() - started < 5  # generous: no work proportional to 2**60


@pytest.mark.parametrize(("data", "words"), [
    (b"GGUL" + bytes(20), "magic"),
    (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), "version 1"),
    (_kv_header(_key("k") + struct.pack("<I", 13)), "unknown value type"),
    (_kv_header(_key("k") + struct.pack("<IIQ", 9, 42, 1)), "unknown array element"),
    (_kv_header(_key("k") + struct.pack("<IIQ", 9, 9, 1) + struct.pack("<IQ", 9, 1)
                + struct.pack("<IQ", 4, 0)), "nested deeper"),
    (_kv_header(_key("k") + struct.pack("<IQ", 8, 2) + b"\xff\xfe"), "not UTF-8"),
    (_kv_header(_key("k") + struct.pack("<II", 4, 1) + _key("k") + struct.pack("<II", 4, 2),
                count=2), "duplicate metadata key"),
    (_kv_header(_key("general.alignment") + struct.pack("<II", 4, 24)), "power of two"),
    (_kv_header(_key("t") + struct.pack("<I", 5) + struct.pack("<5Q", 1, 1, 1, 1, 1),
                count=0, tensors=1), "dimensions"),
])
def test_malformed_headers_are_typed(data: bytes, words: str) -> None:
    with pytest.raises(GgufHeaderError, match=words):
        parse_header(data)


@pytest.mark.slow  # the real model file
def test_tokenize_command_loads_neither_the_transport_nor_the_model_runtime() -> None:
    probe = (
        "import sys\n"
        "from swactor.cli import main\n"
        "assert main(['tokenize', '--json', 'hello world']) == 0\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('tinygrad', 'aioquic', 'numpy', 'gguf', 'jinja2') or m.startswith('swactor.transport'))\n"
        "print('LOADED', loaded)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=120, check=True)
    assert '{"ids": [28120, 905]}' in result.stdout
    assert "LOADED []" in result.stdout, result.stdout
