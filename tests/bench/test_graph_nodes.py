"""``bench batch``'s graph count: kernels a decode replay launches and graph nodes it
updates, read from tinygrad's graph runners, on the NULL device (a graph like a GPU's;
its kernels do nothing, so a tiny role replays in milliseconds)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from tinygrad.helpers import Context
from tinygrad.uop import Ops

from bench.batch import graph_nodes
from swactor.model.gguf_range import open_reader
from swactor.model.llama_role import StageRole
from swactor.wire.tags import SequenceTag
from tests.model.tiny_gguf import TinyConfig, write_tiny_gguf


def test_a_null_device_decode_counts_its_variable_kernels(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf", TinyConfig(blocks=2, seed=8,
                                                              matrix_type=Q.Q4_1))
    weights = open_reader(path).load_stage(0, 2, is_first=True, is_last=True, dtype="f32",
                                           keep_blocks=True)
    with Context(NULL_ALLOW_COPYOUT=1), np.errstate(all="ignore"):
        role = StageRole(weights, max_seq_len=16, quantised=True, slots=2, device="NULL")
        role.run_tagged(SequenceTag(0, 0), np.array([1, 5, 17], dtype=np.int32))
        assert role.decode_graph() is None  # nothing captured before a decode step
        for position in range(3, 7):  # eager, capture, then replays: the graph is built
            role.run_tagged(SequenceTag(0, position), np.array([5], dtype=np.int32))
    captured = role.decode_graph()
    assert captured is not None
    kernels, updated = graph_nodes(captured)
    programs = [u for u in captured.linear.toposort() if u.op is Ops.PROGRAM]
    reading = [p for p in programs if {v.expr for v in p.arg.vars} & {"start_pos", "slot"}]
    # every kernel that reads the position or slot is rewritten at each replay, and the
    # weights' kernels are not
    assert len(reading) <= updated < kernels
    assert kernels >= len(programs)
