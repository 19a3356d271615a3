"""A worker that runs step after step keeps no memory-planner allocator of past steps.

tinygrad 0.14 caches `TLSFAllocator.lv1/lv2` per allocator, so each planned schedule's
allocators stayed alive for the life of the worker (`just soak`: worker RSS grew per
run). Real: the StepRunner, the DeviceBridge on tinygrad's CPU device, and the model's
`StageRole` (one block of a tiny random GGUF) whose prefill the planner plans anew on
every run. Faked: the worker role around it (each step is one prefill of a fixed
prompt, with no input or output objects, so no rings are needed). The count is of live
`TLSFAllocator` objects in this process (`gc`).
"""

from __future__ import annotations

import gc
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from tinygrad.runtime.support.memory import TLSFAllocator
from tinygrad.tensor import Tensor

from swactor.model.gguf_range import open_reader
from swactor.model.llama_role import StageRole
from swactor.wire import (
    ExecuteStep,
    JsonValue,
    OutputBinding,
    RoleId,
    StepCompleted,
    StepId,
    WorkerEvent,
    WorkerGeneration,
)
from swactor.worker.bridge import DeviceBridge
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
        self, inputs: Mapping[int, Tensor], outputs: Sequence[OutputBinding], runtime: JsonValue
    ) -> dict[int, Tensor]:
        self.stage.step(0, PROMPT)
        return {}


def allocators() -> int:
    gc.collect()
    return sum(1 for item in gc.get_objects() if type(item) is TLSFAllocator)


def test_steps_leave_no_planner_allocators_behind(tmp_path: Path) -> None:
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", TINY)
    stage = StageRole(open_reader(gguf).load_stage(0, 1, is_first=True, is_last=False),
                      max_seq_len=16)
    role = PrefillRole(stage)
    events: list[WorkerEvent] = []
    runner = StepRunner(DeviceBridge("CPU", WorkerGeneration(1)), {RoleId(1): role}, {},
                        events.append)

    def step(number: int) -> None:
        runner.submit(ExecuteStep(RoleId(1), StepId(number), (), (), None, False))
        runner.pump()

    step(1)
    baseline = allocators()
    for number in range(2, 2 + STEPS):
        step(number)
    assert events == [StepCompleted(RoleId(1), StepId(n)) for n in range(1, 2 + STEPS)]
    assert allocators() <= baseline
