"""Sequence tags: which KV slot and position an object belongs to (extension beyond spec §17).

Theory of operation
-------------------
The spec's run carries one sequence, so an object's header ``sequence`` (the inference
step, spec §6) is all a stage needs. A serving run carries many sequences through one
provisioned pipeline: the edge's ``sequence`` field stays what it is, the edge's
monotone step counter (every edge is FIFO and gated in order, spec §34), and the
sequence an object belongs to travels in the header's ``flags`` word, which spec §17
leaves opaque to transport and role-defined. A stage never needs the serving session's
sequence id, only where its KV entries live: the tag names a KV *slot* (one per
sequence in flight, ``--slots``) and the *position* of the object's first row. The
orchestrator binds sequence ids to slots (its ``sequence`` table); a slot is reused
only after its sequence ended, and because every edge is FIFO, objects of an ended
sequence still in the pipeline are processed (and their output dropped) before any
object of the slot's next sequence.

``flags`` layout (u32)::

    bit  31      TAGGED      1: the object carries a tag; 0: an untagged single-sequence
                             run (the inference step decides, as in the spec)
    bit  30      CANDIDATES  last stage answers the top CANDIDATES_K (id, logit) pairs
                             instead of one sampled id (the orchestrator samples)
    bits 20..29  slot        0 .. MAX_SLOTS - 1
    bits 0..19   position    position of the object's first row, 0 .. MAX_POSITION

A multi-row object (a prompt) starts at position 0 and resets the slot; a one-row
object at position p > 0 is one decode step that reads the slot's positions 0..p.
Each stage copies the input's flags onto its output object, so the tag reaches the
token-out edge unchanged.

A candidates object on the token-out edge holds ``CANDIDATES_K`` u32 token ids,
most likely first, followed by their ``CANDIDATES_K`` logits as little-endian f32 bit
patterns (``2 * CANDIDATES_K * 4`` bytes, a whole number of u32s, so the edge's
TokenIds spec still applies).
"""

from __future__ import annotations

from dataclasses import dataclass

from swactor.wire.errors import WireError

TAGGED = 1 << 31
CANDIDATES = 1 << 30
SLOT_SHIFT = 20
SLOT_BITS = 10
MAX_SLOTS = 1 << SLOT_BITS
POSITION_BITS = 20
MAX_POSITION = (1 << POSITION_BITS) - 1
CANDIDATES_K = 64
"""Candidates the last stage returns for a sampled step (llama.cpp's default top_k is 40)."""


class TagError(WireError):
    """A sequence tag field out of its range."""

    def __init__(self, field: str, rule: str) -> None:
        super().__init__("SequenceTag", field, rule)


@dataclass(frozen=True, slots=True)
class SequenceTag:
    """Where an object's rows go: KV ``slot``, first row at ``position``; ``candidates``
    asks the last stage for the top ``CANDIDATES_K`` (id, logit) pairs."""

    slot: int
    position: int
    candidates: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.slot < MAX_SLOTS:
            raise TagError("slot", f"{self.slot} is outside 0..{MAX_SLOTS - 1}")
        if not 0 <= self.position <= MAX_POSITION:
            raise TagError("position", f"{self.position} is outside 0..{MAX_POSITION}")

    def pack(self) -> int:
        """The header ``flags`` word for this tag."""
        return (TAGGED | (CANDIDATES if self.candidates else 0)
                | self.slot << SLOT_SHIFT | self.position)

    @classmethod
    def unpack(cls, flags: int) -> SequenceTag | None:
        """The tag in a header's ``flags``; None for an untagged object (flags 0)."""
        if flags == 0:
            return None
        if not flags & TAGGED or flags >> 32:
            raise TagError("flags", f"{flags:#x} is neither 0 nor a sequence tag")
        return cls((flags >> SLOT_SHIFT) & (MAX_SLOTS - 1), flags & MAX_POSITION,
                   bool(flags & CANDIDATES))
