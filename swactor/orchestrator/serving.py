"""Sequences inside a serving run: the generated sequence machine bound per sequence.

Theory of operation. A serving run (fsm/orchestrator_run.yaml, its Serving states; an
extension beyond spec §13) carries many sequences through one provisioned pipeline. The
run binding (`swactor.orchestrator.run.OrchestratorRun`) owns what is run-wide: the free
KV slots, the edge step counter and the objects in flight in edge order, the progress
timer. Each sequence is a `LiveSequence`: a ledger of its own facts (prompt, sampling,
slot, tokens yielded, the input it wants injected next) plus one coroutine per effect of
its `SequenceMachine` (fsm/sequence.yaml), hosted by an `AsyncMachineHost`:

- EmitStarted: the slot is the sequence's; `sequence_started`; the sink's `started()`.
- InjectPrompt / InjectNext: set the input to inject next (the prompt at position 0, or
  the token just accepted at the next position) and feed the run machine `InputReady`,
  which queues behind the run's current event (the run decides and injects).
- MarkFirstToken: `sequence_first_token` with the time since the sequence started.
- YieldToken: the sink's `tokens((token,))`.
- FreeSlot: the slot goes back to the run's free slots.
- EndSequence / FailSequence: the sink's `finished(reason, detail)`; `sequence_finished`
  / `sequence_failed`; the run forgets the sequence (an output still in flight for it is
  then dropped).

The guards read the ledger: `end_of_generation` (the token is one of the model's stop
ids), `length_reached` (counting the token, `max_tokens` are yielded, or feeding it back
would need a position past `max_seq_len - 1`).

`SequenceRequest` is what a caller submits (prompt ids, max_tokens, a `SamplingPolicy`);
`SequenceSink` is where a sequence's results go (the serving engine's stream). A
sampled sequence's objects ask the last stage for its top `CANDIDATES_K` candidates and
`pick` samples one with spec §10's `sample_token`, seeded by (seed, step) where step is
the number of tokens the sequence generated before (the same step a single-prompt run's
last stage uses), so equal requests give equal output whatever else is in flight.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from swactor.events.schema import (
    LifecycleEvent,
    SequenceFailed,
    SequenceFinished,
    SequenceFirstToken,
    SequenceStarted,
)
from swactor.fsm.generated import sequence as sq
from swactor.fsm.host import AsyncMachineHost
from swactor.model.sampling import SamplingKind, SamplingPolicy, sample_token
from swactor.wire import NodeId, RunId
from swactor.wire.tags import CANDIDATES_K

SAMPLED_TOP_K = 40
"""top_k of a sampled sequence: llama.cpp's default (`--top-k 40`), within CANDIDATES_K."""


@dataclass(frozen=True, slots=True)
class SequenceRequest:
    """One sequence to run: prompt ids, how many tokens at most, how to sample."""

    prompt: tuple[int, ...]
    max_tokens: int
    sampling: SamplingPolicy = field(default_factory=SamplingPolicy.greedy)
    first_step: int = 0
    """Sampling step of the first token to generate: 0, or for a continuation of a
    sequence (its prompt carries the tokens it generated before) their count, so its
    draws go on where they stopped."""

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError("a sequence needs at least one prompt token id")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.first_step < 0:
            raise ValueError(f"first_step must be >= 0, got {self.first_step}")

    @property
    def candidates(self) -> bool:
        """Whether the last stage answers candidates (sampled) instead of one greedy id."""
        return self.sampling.kind is SamplingKind.SAMPLE


class SequenceSink(Protocol):
    """Where a sequence's results go (the engine's stream); never blocks."""

    def started(self) -> None: ...

    def tokens(self, ids: tuple[int, ...]) -> None: ...

    def finished(self, reason: str, detail: str) -> None:
        """`reason`: stop, length, cancelled or error (then `detail` says why)."""
        ...


class RunSide(Protocol):
    """What a sequence asks of its run (the run binding answers)."""

    node_id: NodeId
    run_id: RunId

    def emit(self, event: LifecycleEvent) -> None: ...

    async def input_ready(self, sequence_id: int) -> None: ...

    def free_slot(self, slot: int) -> None: ...

    def forget(self, sequence_id: int) -> None: ...


def pick_candidate(ids: tuple[int, ...], policy: SamplingPolicy, step: int) -> int:
    """Sample one id from a candidates answer (`CANDIDATES_K` ids, then their f32 logits
    as u32 bit patterns, most likely first) with `sample_token`, top_k at most K."""
    k = len(ids) // 2
    logits = np.array(struct.unpack(f"<{k}f", struct.pack(f"<{k}I", *ids[k:])),
                      dtype=np.float32)
    top_k = min(policy.top_k or SAMPLED_TOP_K, k)
    bounded = SamplingPolicy.sample(temperature=policy.temperature, top_k=top_k,
                                    top_p=policy.top_p, seed=policy.seed)
    return ids[sample_token(logits, bounded, step)]


class LiveSequence(sq.SequenceEffects[Awaitable[None]]):
    """One sequence's ledger, guards and effects (module doc)."""

    def __init__(
        self,
        sequence_id: int,
        request: SequenceRequest,
        sink: SequenceSink,
        run: RunSide,
        stop_token_ids: frozenset[int],
        max_seq_len: int,
    ) -> None:
        self.sequence_id = sequence_id
        self.request = request
        self.sink = sink
        self.run = run
        self.stop_token_ids = stop_token_ids
        self.max_seq_len = max_seq_len
        self.slot: int | None = None
        self.generated: list[int] = []
        self.next_input: tuple[tuple[int, ...], int] = (request.prompt, 0)
        """The ids to inject next and the position of the first."""
        self.started_at: float | None = None
        self.machine = sq.SequenceMachine(self)
        self._host = AsyncMachineHost(self.machine, sq.bind(self))

    async def feed(self, event: sq.Event) -> None:
        await self._host.feed(event)

    @property
    def step(self) -> int:
        """The sampling step of the output in flight: tokens generated before it (by
        this run, after `first_step` generated before)."""
        return self.request.first_step + len(self.generated)

    def pick(self, ids: tuple[int, ...]) -> int:
        """The token of an output: a candidates answer sampled, else its one id."""
        if len(ids) == 2 * CANDIDATES_K:
            return pick_candidate(ids, self.request.sampling, self.step)
        return ids[0]

    # -- guards (SequenceGuards) -------------------------------------------------------

    def end_of_generation(self, event: sq.TokenAccepted) -> bool:
        return event.token in self.stop_token_ids

    def length_reached(self, event: sq.TokenAccepted) -> bool:
        generated = len(self.generated) + 1
        # Feeding token g back takes position prompt + g - 1; the last is max_seq_len - 1.
        return (generated >= self.request.max_tokens
                or len(self.request.prompt) + generated > self.max_seq_len)

    # -- effects (SequenceEffects) -----------------------------------------------------

    def _emit(self, make: Callable[..., LifecycleEvent], **detail: str | int | float) -> None:
        self.run.emit(make(node_id=self.run.node_id, run_id=self.run.run_id,
                           detail={"sequence_id": self.sequence_id, **detail}))

    async def emit_started(self, slot: int) -> None:
        self.slot = slot
        self.started_at = time.monotonic()
        self._emit(SequenceStarted, slot=slot, prompt_tokens=len(self.request.prompt))
        self.sink.started()

    async def inject_prompt(self) -> None:
        self.next_input = (self.request.prompt, 0)
        await self.run.input_ready(self.sequence_id)

    async def mark_first_token(self) -> None:
        started = self.started_at if self.started_at is not None else time.monotonic()
        self._emit(SequenceFirstToken, ttft_s=round(time.monotonic() - started, 6))

    async def yield_token(self, token: int) -> None:
        self.generated.append(token)
        self.sink.tokens((token,))

    async def inject_next(self, token: int) -> None:
        self.next_input = ((token,), len(self.request.prompt) + len(self.generated) - 1)
        await self.run.input_ready(self.sequence_id)

    async def free_slot(self) -> None:
        assert self.slot is not None, "the table frees a slot only after SlotBound"
        self.run.free_slot(self.slot)
        self.slot = None

    async def end_sequence(self, reason: str) -> None:
        self.run.forget(self.sequence_id)
        self._emit(SequenceFinished, reason=reason, tokens=len(self.generated))
        self.sink.finished(reason, "")

    async def fail_sequence(self, detail: str) -> None:
        self.run.forget(self.sequence_id)
        self._emit(SequenceFailed, error=detail, tokens=len(self.generated))
        self.sink.finished("error", detail)
