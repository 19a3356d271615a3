"""A GGUF header parser: key/value metadata and the tensor table, arrays read in bulk.

Theory of operation: a GGUF file starts with ``GGUF``, a version (2 or 3), the tensor
count and the key/value count, then the key/value pairs, then one entry per tensor (name,
dimensions, type, offset relative to the data section), then padding up to
``general.alignment`` (default 32) where the tensor data starts. :func:`parse_header`
walks those bytes once with ``struct`` and turns every value into plain Python: numbers,
``bool``, ``str``, and lists of them for arrays. A numeric array becomes one
``array.frombytes(...).tolist()`` call whatever its length, and a string array one loop of
``unpack_from`` and ``decode``, so a 49k-entry vocabulary costs tens of milliseconds (the
``gguf`` package's reader builds a numpy view per string, about a million views for the
same file).

The bytes come from outside, so every length is checked against the bytes at hand
before anything proportional to it is allocated or looped over: a value that runs past
the end of ``data`` raises :class:`NeedMoreBytes` with the offset it needs, which a
caller reading a prefix of the file answers by reading more (never past the file's
size) or by reporting truncation. Anything that cannot be a GGUF header (bad magic,
unknown version or value type, arrays nested deeper than :data:`MAX_ARRAY_DEPTH`, a
string that is not UTF-8, a duplicate key or tensor name, an alignment that is not a
power of two) raises :class:`GgufHeaderError`. Files written big-endian (their version
reads byte-swapped) are read big-endian.
"""

from __future__ import annotations

import array
import os
import struct
import sys
from dataclasses import dataclass
from typing import Any

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_ARRAY_DEPTH = 2
MAX_DIMS = 4  # GGML_MAX_DIMS
KEY_ALIGNMENT = "general.alignment"

# GGUF value types by their struct format (without byte order); arrays of them are read
# with the ``array`` module (same letters, sizes checked at import)
_SCALARS: dict[int, str] = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "B",  # bool: one byte
    10: "Q",
    11: "q",
    12: "d",
}
for _code in set(_SCALARS.values()):
    assert array.array(_code).itemsize == struct.calcsize("<" + _code), _code
_BIG_ENDIAN_HOST = sys.byteorder == "big"
_TYPE_STRING = 8
_TYPE_ARRAY = 9
_TYPE_BOOL = 7
_SLACK = 64 << 10  # read past an estimated array end: the rest of the header is small


class GgufHeaderError(ValueError):
    """Bytes that are not a well-formed GGUF header (the message says where and why)."""


class NeedMoreBytes(Exception):
    """The header continues past the bytes given: ``end`` is the first offset it needs;
    ``estimate`` (at least ``end``) where the header probably ends, when a long array
    ran out (its remaining entries taken at the mean size of those read)."""

    def __init__(self, end: int, estimate: int | None = None) -> None:
        super().__init__(end)
        self.end = end
        self.estimate = max(end, estimate or 0)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor table entry as the file states it (``dims`` in GGML order, innermost
    first; ``offset`` relative to the data section)."""

    name: str
    dims: tuple[int, ...]
    type_id: int
    offset: int


@dataclass(frozen=True)
class GgufHeader:
    """The parsed header: metadata as plain values, the tensor table, where data starts."""

    version: int
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    alignment: int
    header_bytes: int  # end of the tensor table
    data_offset: int  # header_bytes rounded up to the alignment


class _Cursor:
    """Reads little- or big-endian values from ``data`` at ``pos``."""

    def __init__(self, data: bytes, order: str) -> None:
        self.data = data
        self.size = len(data)
        self.pos = 0
        self.order = order
        self._u64 = struct.Struct(order + "Q")
        self._u32 = struct.Struct(order + "I")

    def need(self, count: int) -> None:
        end = self.pos + count
        if end > self.size:
            raise NeedMoreBytes(end)

    def u32(self) -> int:
        self.need(4)
        (value,) = self._u32.unpack_from(self.data, self.pos)
        self.pos += 4
        return int(value)

    def u64(self) -> int:
        self.need(8)
        (value,) = self._u64.unpack_from(self.data, self.pos)
        self.pos += 8
        return int(value)

    def string(self, what: str) -> str:
        length = self.u64()
        self.need(length)
        start = self.pos
        self.pos += length
        try:
            return self.data[start : self.pos].decode("utf-8")
        except UnicodeDecodeError:
            raise GgufHeaderError(f"{what} at byte {start} is not UTF-8") from None

    def value(self, type_id: int, what: str, depth: int = 0) -> Any:
        if type_id == _TYPE_STRING:
            return self.string(what)
        if type_id == _TYPE_ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise GgufHeaderError(f"{what}: arrays nested deeper than {MAX_ARRAY_DEPTH}")
            return self.array(what, depth + 1)
        scalar = _SCALARS.get(type_id)
        if scalar is None:
            raise GgufHeaderError(f"{what}: unknown value type {type_id}")
        fmt = struct.Struct(self.order + scalar)
        self.need(fmt.size)
        (value,) = fmt.unpack_from(self.data, self.pos)
        self.pos += fmt.size
        return bool(value) if type_id == _TYPE_BOOL else value

    def array(self, what: str, depth: int) -> list[Any]:
        type_id = self.u32()
        count = self.u64()
        scalar = _SCALARS.get(type_id)
        if scalar is not None:
            values = array.array(scalar)
            nbytes = count * values.itemsize
            self.need(nbytes)
            values.frombytes(self.data[self.pos : self.pos + nbytes])
            self.pos += nbytes
            if (self.order == ">") != _BIG_ENDIAN_HOST:
                values.byteswap()
            if type_id == _TYPE_BOOL:
                return [bool(v) for v in values]
            result: list[Any] = values.tolist()
            return result
        if type_id == _TYPE_STRING:
            self.need(count * 8)  # every string has at least its length
            return self._strings(count, what)
        if type_id == _TYPE_ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise GgufHeaderError(f"{what}: arrays nested deeper than {MAX_ARRAY_DEPTH}")
            self.need(count * 12)  # every inner array has at least its type and count
            return [self.array(what, depth + 1) for _ in range(count)]
        raise GgufHeaderError(f"{what}: unknown array element type {type_id}")

    def _strings(self, count: int, what: str) -> list[str]:
        raw, size, pos = self.data, self.size, self.pos
        start = pos
        unpack = self._u64.unpack_from
        out: list[str] = []
        append = out.append
        try:
            for _ in range(count):
                if pos + 8 > size:
                    raise NeedMoreBytes(pos + 8)
                (length,) = unpack(raw, pos)
                pos += 8
                end = pos + length
                if end > size:
                    raise NeedMoreBytes(end)
                append(raw[pos:end].decode("utf-8"))
                pos = end
        except NeedMoreBytes as more:
            done = len(out)
            mean = (pos - start) // max(done, 1)
            raise NeedMoreBytes(more.end, pos + mean * (count - done) + _SLACK) from None
        except UnicodeDecodeError:
            raise GgufHeaderError(f"{what}: string at byte {pos} is not UTF-8") from None
        self.pos = pos
        return out


def parse_header(data: bytes | memoryview) -> GgufHeader:
    """Parse the header at the start of ``data`` (a whole file or a prefix of one)."""
    data = bytes(data)
    if len(data) < 8:
        raise NeedMoreBytes(8)
    if data[:4] != MAGIC:
        raise GgufHeaderError("not a GGUF file (magic bytes differ)")
    order = "<"
    (version,) = struct.unpack_from("<I", data, 4)
    if version & 0xFFFF == 0:  # written on a big-endian machine
        order = ">"
        (version,) = struct.unpack_from(">I", data, 4)
    if version not in SUPPORTED_VERSIONS:
        raise GgufHeaderError(f"GGUF version {version} (supported: 2, 3)")
    cursor = _Cursor(data, order)
    cursor.pos = 8
    tensor_count = cursor.u64()
    kv_count = cursor.u64()
    # bound the loops by what the bytes can hold before looping (smallest entry sizes)
    cursor.need(kv_count * 12 + tensor_count * 24)
    metadata: dict[str, Any] = {}
    for index in range(kv_count):
        key = cursor.string(f"key #{index}")
        if key in metadata:
            raise GgufHeaderError(f"duplicate metadata key {key!r}")
        metadata[key] = cursor.value(cursor.u32(), key)
    tensors: list[TensorInfo] = []
    names: set[str] = set()
    for index in range(tensor_count):
        name = cursor.string(f"tensor name #{index}")
        if name in names:
            raise GgufHeaderError(f"duplicate tensor {name!r}")
        names.add(name)
        n_dims = cursor.u32()
        if n_dims > MAX_DIMS:
            raise GgufHeaderError(f"tensor {name!r} has {n_dims} dimensions")
        dims = tuple(cursor.u64() for _ in range(n_dims))
        type_id = cursor.u32()
        offset = cursor.u64()
        tensors.append(TensorInfo(name, dims, type_id, offset))
    alignment = metadata.get(KEY_ALIGNMENT, DEFAULT_ALIGNMENT)
    if (
        isinstance(alignment, bool)
        or not isinstance(alignment, int)
        or alignment <= 0
        or alignment & (alignment - 1)
    ):
        raise GgufHeaderError(f"{KEY_ALIGNMENT} = {alignment!r} is not a power of two")
    end = cursor.pos
    data_offset = -(-end // alignment) * alignment
    return GgufHeader(
        version=version,
        metadata=metadata,
        tensors=tuple(tensors),
        alignment=alignment,
        header_bytes=end,
        data_offset=data_offset,
    )


FIRST_READ_BYTES = 1 << 20
LOCAL_FIRST_READ_BYTES = 4 << 20  # a local read is cheap: most headers parse at once


def grow_to(current: int, more: NeedMoreBytes, file_size: int) -> int:
    """How many bytes to hold next when ``current`` bytes fell short by ``more``: the
    header's estimated end, and at least an eighth more than now (few re-parses, a small
    read past the end)."""
    return min(file_size, max(more.estimate, current + current // 8))


def read_local_header(path: str | os.PathLike[str]) -> tuple[GgufHeader, int]:
    """Parse the header of the local file at ``path``; (header, bytes read).

    ``OSError`` passes through; a file that ends inside its header raises
    :class:`NeedMoreBytes` with an ``end`` beyond the file's size.
    """
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        data = file.read(min(size, LOCAL_FIRST_READ_BYTES))
        while True:
            try:
                return parse_header(data), len(data)
            except NeedMoreBytes as more:
                if more.end > size:
                    raise
                want = grow_to(len(data), more, size)
                data += file.read(want - len(data))
