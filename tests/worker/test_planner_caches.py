"""A worker that runs step after step keeps no memory-planner allocator of past steps.

tinygrad 0.14 caches `TLSFAllocator.lv1/lv2` per allocator, so each planned schedule's
allocators stayed alive for the life of the worker (`just soak`: worker RSS grew per
run). Real: the StepRunner running a standing grant's steps, the DeviceBridge on
tinygrad's CPU device, and the model's `StageRole` (one block of a tiny random GGUF)
whose prefill the planner plans anew on every run. Faked: the worker role around it
(each step is one prefill of a fixed prompt, whatever its 4-byte input; its output is
4 bytes) and the rings (each step's input is handed to the runner as its ingress ring
would load it; the egress ring takes the output at once). The count is of live
`TLSFAllocator` objects in this process (`gc`).
"""

from __future__ import annotations

import gc
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
from tinygrad.runtime.support.memory import TLSFAllocator
from tinygrad.tensor import Tensor

from swactor.model.gguf_range import open_reader
from swactor.model.llama_role import StageRole
from swactor.wire import (
    AwaitedInput,
    EdgeId,
    GrantSteps,
    ObjectFailure,
    ObjectId,
    ObjectLoaded,
    OutputBinding,
    PortId,
    RingId,
    RoleId,
    StepCompleted,
    StepId,
    WorkerEvent,
    WorkerGeneration,
)
from swactor.wire import Sequence as Seq
from swactor.worker.bridge import DeviceAllocation, DeviceBridge
from swactor.worker.egress import EgressRing, OutputListener
from swactor.worker.steps import StepRunner
from tests.model.tiny_gguf import TinyConfig, write_tiny_gguf

STEPS = 6


TINY = TinyConfig(blocks=1, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=64, context=32,
                  seed=5)
PROMPT = np.array([3, 17, 42, 9], dtype=np.int32)


class PrefillRole:
    """Each step: the model stage's prefill of `PROMPT` (a planned schedule)."""

    def __init__(self, stage: StageRole) -> None:
        self.stage = stage

    def run(
        self, inputs: Mapping[int, Tensor], outputs: Sequence[OutputBinding]
    ) -> dict[int, Tensor | npt.NDArray[np.float32]]:
        self.stage.step(0, PROMPT)
        return {1: np.zeros(1, np.float32)}


class Sink(EgressRing):
    """An egress ring that takes each output at once (no arena, no ring behind it)."""

    def __init__(self) -> None:  # the runner reads nothing the real one sets up
        pass

    @property
    def idle(self) -> bool:
        return True

    def refusal(self, extent: int) -> ObjectFailure | None:
        return None

    def produce(self, binding: OutputBinding, source: DeviceAllocation,
                listener: OutputListener) -> None:
        listener.output_done()


def allocators() -> int:
    gc.collect()
    return sum(1 for item in gc.get_objects() if type(item) is TLSFAllocator)


def test_steps_leave_no_planner_allocators_behind(tmp_path: Path) -> None:
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", TINY)
    stage = StageRole(open_reader(gguf).load_stage(0, 1, is_first=True, is_last=False),
                      max_seq_len=16)
    role = PrefillRole(stage)
    events: list[WorkerEvent] = []
    bridge = DeviceBridge("CPU", WorkerGeneration(1))
    runner = StepRunner(bridge, {RoleId(1): role}, {RingId(2): Sink()}, events.append)
    runner.grant(GrantSteps(
        RoleId(1), StepId(1), AwaitedInput(PortId(1), RingId(1), Seq(0), 4),
        OutputBinding(PortId(1), RingId(2), ObjectId(100), Seq(0), 4,
                      per_input_row=True)))

    def step(number: int) -> None:
        handle = bridge.register(bridge.alloc(4))
        runner.object_loaded(ObjectLoaded(RingId(1), EdgeId(1), PortId(1), ObjectId(number),
                                          Seq(number - 1), 4, handle))
        runner.pump()

    step(1)
    baseline = allocators()
    for number in range(2, 2 + STEPS):
        step(number)
    assert [type(e) for e in events] == [StepCompleted] * (1 + STEPS)
    assert [e.step_id for e in events if isinstance(e, StepCompleted)] == list(
        range(1, 2 + STEPS))
    assert allocators() <= baseline
