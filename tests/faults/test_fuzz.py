"""Bad input: Hypothesis fuzz of every parser that reads another party's bytes.

Each target must either accept its input or reject it with its own typed error (the
§37 reason where one applies); any other exception fails the test. Targets: the object
header parser, the edge preamble, the control-message decoder (frame and message), the
worker JSON adapter (both ends), the GGUF reader (header and a stage's tensor check), the
YAML table loader, and the SWIM datagram decoder: raw datagrams (the checks before the
signature: size, version, length, allow-list, target, freshness, signature) and bodies
sealed with a valid key (the bounded JSON parser and field checks behind it).

Example counts: `SWACTOR_FUZZ_EXAMPLES` per target (`just fuzz` sets 100000); by default
`CI_EXAMPLES` (a few thousand in all, a few seconds each). Tests of other components
already fuzz some of these with small counts (tests/wire/test_objects.py,
tests/worker/test_adapter_fuzz.py, tests/codegen/test_loader_fuzz.py); these reuse their
strategies and make the count a knob.
"""

from __future__ import annotations

import itertools
import json
import os
import struct
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codegen.errors import TableError
from codegen.loader import load_table
from swactor.fsm.generated import gpu_worker_ctl as gwc
from swactor.fsm.generated import worker_process as wp
from swactor.membership.messages import AliveUpdate, BootHealth, MemberMeta, Ping
from swactor.membership.wire import Codec, Decoded, MembershipWireError, Signer, seal
from swactor.model.errors import WeightsError, WeightsFault
from swactor.model.gguf_range import GgufRangeReader
from swactor.node.worker_ctl import decode_worker_line
from swactor.transport.control import _message, _Reject, decode_frame, encode_frame
from swactor.transport.identity import NodeIdentity
from swactor.transport.run_control import REGISTRY
from swactor.wire import (
    EdgeId,
    EdgePreamble,
    NodeId,
    ObjectFailure,
    ObjectHeader,
    ObjectHeaderError,
    ObjectId,
    PreambleError,
    Sequence,
)
from swactor.worker.adapter import parse_command
from tests.codegen.test_loader_fuzz import BASE as TABLE_BASE
from tests.codegen.test_loader_fuzz import PATHS as TABLE_PATHS
from tests.codegen.test_loader_fuzz import _damaged
from tests.codegen.test_loader_fuzz import values as table_values
from tests.model.tiny_gguf import TinyConfig, write_tiny_gguf
from tests.worker.test_adapter_fuzz import node_lines, worker_lines

CI_EXAMPLES = 1000


def examples(ci: int = CI_EXAMPLES) -> int:
    return int(os.environ.get("SWACTOR_FUZZ_EXAMPLES", ci))


def fuzz(ci: int = CI_EXAMPLES) -> settings:
    return settings(max_examples=examples(ci), deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def mutated(valid: bytes) -> st.SearchStrategy[bytes]:
    """Bytes near `valid`: flips, splices, truncations, extensions — and plain noise."""
    def apply(edits: list[tuple[int, int]], cut: int, tail: bytes) -> bytes:
        data = bytearray(valid)
        for position, value in edits:
            data[position % len(data)] = value
        return bytes(data[:cut]) + tail

    near = st.builds(apply, st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)),
                                     max_size=6),
                     st.integers(0, len(valid)), st.binary(max_size=16))
    return near | st.binary(max_size=2 * len(valid))


# -- object header and preamble ------------------------------------------------------------

HEADER = ObjectHeader(ObjectId(7), Sequence(3), 4096, 0).pack()
PREAMBLE = EdgePreamble(EdgeId(9)).pack()


@fuzz()
@given(mutated(HEADER))
def test_object_header_parser(data: bytes) -> None:
    try:
        header = ObjectHeader.unpack(data)
    except ObjectHeaderError as error:
        assert isinstance(error.reason, ObjectFailure)
        return
    assert header.pack() == data[: len(header.pack())]


@fuzz()
@given(mutated(PREAMBLE))
def test_edge_preamble(data: bytes) -> None:
    try:
        preamble = EdgePreamble.unpack(data)
    except PreambleError as error:
        assert error.reason is not None
        return
    assert preamble.pack() == data[: len(preamble.pack())]


# -- control messages -----------------------------------------------------------------------

REGISTRY_BY_NAME = {t.__name__: t for t in REGISTRY}
finite_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
control_documents = st.builds(
    lambda name, body: {"kind": "request", "type": name, "body": body},
    st.sampled_from(sorted(REGISTRY_BY_NAME)) | st.text(max_size=10), finite_json)
control_frames = (
    st.binary(max_size=256)
    | st.builds(lambda d: encode_frame(d), control_documents)
    | st.builds(lambda d: encode_frame(d), st.dictionaries(st.text(max_size=6), finite_json,
                                                            max_size=4))
    | st.builds(lambda d, cut: encode_frame(d)[:cut], control_documents, st.integers(0, 64))
)


@fuzz()
@given(control_frames)
def test_control_message_decoder(frame: bytes) -> None:
    try:
        document = decode_frame(frame)
        message = _message(document, REGISTRY_BY_NAME)
    except _Reject as rejection:
        assert rejection.reason is not None
        return
    assert type(message).__name__ in REGISTRY_BY_NAME
    assert type(message).from_json(message.to_json()) == message


# -- worker JSON adapter ----------------------------------------------------------------------

@fuzz()
@given(node_lines, st.booleans())
def test_worker_adapter_node_end(line: str, truncated: bool) -> None:
    event = decode_worker_line(line, truncated)
    assert type(event).__module__ == gwc.__name__
    assert not truncated or isinstance(event, gwc.AdapterFailed)


@fuzz()
@given(worker_lines)
def test_worker_adapter_worker_end(line: bytes) -> None:
    event = parse_command(line)
    assert type(event).__module__ == wp.__name__


# -- GGUF reader -------------------------------------------------------------------------------

class _Bytes:
    """An in-memory `ByteSource`."""

    def __init__(self, data: bytes) -> None:
        self.name = "fuzz.gguf"
        self.bytes_read = 0
        self.data = data

    def size(self) -> int:
        return len(self.data)

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > len(self.data):
            raise WeightsError(WeightsFault.Truncated,
                               f"read {offset}+{length} past {len(self.data)} bytes")
        self.bytes_read += length
        return self.data[offset:offset + length]


def _tiny_gguf_prefix() -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_gguf(Path(tmp) / "t.gguf",
                               TinyConfig(blocks=1, hidden=32, heads=2, kv_heads=1, ffn=32,
                                          vocab=16, context=8))
        return path.read_bytes()


GGUF = _tiny_gguf_prefix()
GGUF_HEAD = GGUF[:2048]


@fuzz(ci=300)
@given(mutated(GGUF_HEAD))
def test_gguf_reader(head: bytes) -> None:
    data = head + GGUF[len(GGUF_HEAD):] if len(head) == len(GGUF_HEAD) else head
    try:
        reader = GgufRangeReader(_Bytes(data))
        reader.validate_stage(0, 1, is_first=True, is_last=True, hidden_dim=32,
                              dtype_family="f32", max_seq_len=8)
    except WeightsError:
        return


def _with_u32(data: bytes, key: str, value: int) -> bytes:
    """`data` (a GGUF) with the u32 metadata `key` set to `value`."""
    name = key.encode()
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    assert struct.unpack_from("<I", data, at)[0] == 4  # GGUF value type u32
    return data[:at + 4] + struct.pack("<I", value) + data[at + 8:]


@pytest.mark.parametrize("key", ["llama.attention.head_count",
                                 "llama.attention.head_count_kv"])
def test_gguf_reader_refuses_zero_heads(key: str) -> None:
    """Found by `just fuzz` (atheris): a head count of 0 was a ZeroDivisionError."""
    with pytest.raises(WeightsError) as refused:
        GgufRangeReader(_Bytes(_with_u32(GGUF, key, 0)))
    assert refused.value.reason is WeightsFault.CorruptHeader


# -- YAML table loader --------------------------------------------------------------------------

@fuzz(ci=300)
@given(st.sampled_from(TABLE_PATHS), table_values, st.booleans())
def test_yaml_table_loader(path: tuple[Any, ...], value: Any, delete: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "lease_desk.yaml"
        target.write_text(yaml.safe_dump(_damaged(path, value, delete)), encoding="utf-8")
        try:
            load_table(target)
        except TableError:
            return


@fuzz(ci=300)
@given(st.binary(max_size=400) | st.text(max_size=400).map(str.encode))
def test_yaml_table_loader_raw_bytes(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "lease_desk.yaml"
        target.write_bytes(data)
        try:
            load_table(target)
        except TableError:
            return


# -- SWIM datagrams ------------------------------------------------------------------------------

SWIM_CLOCK = 1_800_000_000.0
SWIM_SENDER = NodeIdentity.generate()
SWIM_VICTIM = NodeIdentity.generate()
_SWIM_N = itertools.count(int(SWIM_CLOCK * 1e6) - 10_000_000)
"""Fresh datagram counters inside the victim's freshness window, one per example."""


def _swim_codec(identity: NodeIdentity) -> Codec:
    return Codec(Signer(identity.private_key), clock=lambda: SWIM_CLOCK)


SWIM_RX = _swim_codec(SWIM_VICTIM)
"""One victim for every example: its replay and signature caches must stay bounded too."""
_SWIM_ME = NodeId(SWIM_SENDER.node_id)
SWIM_MESSAGE = Ping(_SWIM_ME, 9, NodeId(SWIM_VICTIM.node_id), (AliveUpdate(
    _SWIM_ME, 3, MemberMeta("10.0.0.1", 7946, "10.0.0.1", 4433, BootHealth.Available, "cpu",
                            1 << 30)),))
SWIM_DATAGRAM = _swim_codec(SWIM_SENDER).encode(SWIM_MESSAGE, NodeId(SWIM_VICTIM.node_id))[0]
SWIM_BODY = SWIM_DATAGRAM[22:-96]
swim_bodies = (
    mutated(SWIM_BODY)
    | st.builds(lambda d: json.dumps(d).encode(), finite_json)
    | st.builds(lambda d, kind: json.dumps({"t": kind, "s": SWIM_SENDER.node_id, **d}).encode(),
                st.dictionaries(st.sampled_from(["q", "tg", "r", "n", "u", "x"]), finite_json,
                                max_size=4),
                st.sampled_from(["ping", "ack", "nack", "pingreq", "gossip", "sync", "?"]))
    | st.builds(lambda depth, digits: b"[" * depth + b"9" * digits + b"]" * depth,
                st.integers(0, 4000), st.integers(0, 5000))
)


def _swim_decoded(datagram: bytes) -> Decoded | None:
    try:
        return SWIM_RX.decode(datagram, ("127.0.0.1", 7946), 0.0)
    except MembershipWireError as error:
        assert error.field
        return None


@fuzz()
@given(mutated(SWIM_DATAGRAM))
def test_swim_datagram_decoder(data: bytes) -> None:
    decoded = _swim_decoded(data)
    if decoded is not None and decoded.message is not None:
        assert data == SWIM_DATAGRAM  # nothing else carries a valid signature


@fuzz()
@given(swim_bodies)
def test_swim_signed_body_decoder(body: bytes) -> None:
    if len(body) > 8000:
        body = body[:8000]
    _swim_decoded(seal(body, SWIM_SENDER.private_key, to=SWIM_VICTIM.node_id, n=next(_SWIM_N)))


def test_fuzz_inputs_are_not_all_rejected() -> None:
    """The valid seeds parse (so the targets above exercise their accepting paths too)."""
    assert ObjectHeader.unpack(HEADER).pack() == HEADER
    assert EdgePreamble.unpack(PREAMBLE).pack() == PREAMBLE
    assert GgufRangeReader(_Bytes(GGUF)).tensors
    assert load_table(Path("tests/codegen/fixtures/good/lease_desk.yaml")) is not None
    assert TABLE_BASE and json.dumps(TABLE_BASE)
    frame = encode_frame({"kind": "request", "type": "StopRunMessage",
                          "body": {"run_id": 1, "stage_index": 0}})
    assert type(_message(decode_frame(frame), REGISTRY_BY_NAME)).__name__ == "StopRunMessage"
    assert NodeId(1) == 1
    fresh = seal(SWIM_BODY, SWIM_SENDER.private_key, to=SWIM_VICTIM.node_id, n=next(_SWIM_N))
    assert _swim_codec(SWIM_VICTIM).decode(fresh, ("127.0.0.1", 1), 0.0).message == SWIM_MESSAGE
