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

Batch objects: one decode step for several sequences
----------------------------------------------------
Every object pays a fixed cost on its way through a stage (rings, the edge's stream,
the worker's step), several times a one-row decode's compute on a small model. A
*batch* object carries one decode row each of ``B`` different sequences, so that
cost is paid once for ``B`` rows. The header has one ``flags`` word, so a batch object
says only that it is one and how many rows it has; the rows' tags travel in the
payload::

    flags:  bit 31 = 0 (not a single tag), bit 29 BATCH = 1, bits 0..10 = B
            (1 .. MAX_SLOTS); every other bit 0
    payload: B u32 (little endian) packed SequenceTags, the *tag table*, zero bytes
            up to a whole number of the edge's rows (:func:`table_bytes`), then the
            object's B rows in table order (B token ids on token-in, B activation
            rows between stages, B answers on token-out)

An edge's ``ObjectSpec.alignment`` is its row (spec §17: one u32 on a token edge, one
``hidden * width`` activation row between stages), and every extent on it is a whole
number of rows. So the table is padded to whole rows of the edge it travels on: on a
token edge 4 bytes are a row and it is exactly ``4 * B`` bytes; on an activation edge
it takes ``ceil(4 * B / row)`` rows (one row for any batch of a small model), and a
batch object is exactly that padding plus ``B`` rows. The padding bytes are zero, and a
stage refuses a batch whose padding is not. A stage reads the table at its input
edge's row size and writes it padded at its output edge's.

Each table entry is a full single-object tag (TAGGED set, its own CANDIDATES bit),
a decode row: position > 0, and no two rows name the same slot. ``B`` must not exceed
the stage's slots. Every stage checks the table before it computes anything
(:func:`batch_table`: bounds first, then each entry, a bad table is a
:class:`TagError`, never a partial step), copies ``flags`` and the table onto its
output, and writes its ``B`` result rows after it. The last stage's rows are
per-row answers encoded as for a single object, concatenated in table order: one id,
or ``2 * CANDIDATES_K`` u32s where the row's tag asks for candidates
(:func:`answer_words`), so the orchestrator finds each row's answer from the table
alone and routes it to its sequence. Prompts (position 0, any rows) are never in a
batch object: they travel as single-tag objects or in a prompt batch (below); a
batch of one row travels as a single-tag object.

Prompt batches: several prompts in one object
---------------------------------------------
An object pays a cost besides its rows' compute (a ring slot, an edge send, the
worker's step, the orchestrator's hop per stage). Prompts submitted together (the
sequences a serving session migrates to a new run after a fault, or requests that
arrive at once) therefore travel as one *prompt batch*, one object per edge for all of
them. A stage prefills its prompts one after another, each exactly as it would prefill
the prompt alone (``StageRole.run_prompts``), so each prompt's rows, answer and KV
entries are bit-identical to the prompt sent alone::

    flags:  bit 31 = 0, bit 29 BATCH = 1, bit 28 PROMPTS = 1, bits 0..10 = S
            (1 .. MAX_PROMPTS); every other bit 0
    payload: S u32 table entries, zero bytes up to a whole number of the edge's rows
            (:func:`table_bytes`, as a batch's table), then every prompt's rows, one
            prompt after another in table order

Each table entry is a tag (TAGGED set, its own CANDIDATES bit) of the prompt's slot
whose *position field holds the prompt's row count* (1 .. MAX_POSITION): every prompt
starts at position 0 of its slot and resets it, so the start needs no field, and the
count is what a stage needs to find the prompt's rows. No two entries name the same
slot, and the rows after the table are exactly the sum of the counts. A stage copies
``flags`` and the table onto its output; its rows are every prompt's activation rows
(table order), on the last stage each prompt's answer (to its last row: one id, or
candidates) concatenated in table order, as a batch's. A reader that knows no prompt
batches refuses the flags word (its batch check finds a bit it does not know), so a
mixed pool fails the step, never the numbers. :func:`table_entries` and
:func:`read_table` read every kind of table.

Mixed steps: a prompt and decode rows in one object
---------------------------------------------------
While a stage prefills a prompt, the sequences it is decoding would wait for the
prefill and then pay a decode step of their own. A *mixed step* carries one prompt and
one decode row each of ``D`` other sequences, which a stage runs as one step
(``StageRole.run_mixed``: one graph where the rows fit the prompt's padding rows, else
the prompt and then the rows), every result bit-identical to the prompt and the rows
sent apart::

    flags:  bit 31 = 0, bit 29 BATCH = 1, bit 27 MIXED = 1, bits 0..10 = 1 + D
            (2 .. MAX_SLOTS); every other bit 0
    payload: 1 + D u32 table entries, zero bytes up to a whole number of the edge's
            rows (as a batch's table), then the prompt's rows, then the D decode rows
            in table order

Entry 0 is the prompt's tag, its position field its row count (as in a prompt batch);
entries 1..D are decode rows' tags (position > 0, as in a batch). No two entries name
the same slot. A stage copies ``flags`` and the table onto its output; its rows are
the prompt's activation rows then the decode rows', on the last stage the prompt's
answer then each row's, in table order. A reader that knows no mixed steps refuses the
flags word, as for prompt batches.
"""

from __future__ import annotations

from collections.abc import Sequence
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
BATCH = 1 << 29
"""With TAGGED clear: a batch object of ``flags & BATCH_ROWS_MASK`` decode rows."""
BATCH_ROWS_MASK = (1 << 11) - 1
PROMPTS = 1 << 28
"""With BATCH (TAGGED clear): a prompt batch of ``flags & BATCH_ROWS_MASK`` prompts."""
MIXED = 1 << 27
"""With BATCH (TAGGED and PROMPTS clear): a mixed step of ``flags & BATCH_ROWS_MASK``
entries, one prompt then decode rows."""
MAX_PROMPTS = 4
"""Prompts one prompt batch carries at most (a bound on the work one object asks of a
stage)."""
TAG_WIDTH = 4
"""Bytes of one tag table entry (a little-endian u32)."""


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


def batch_flags(rows: int) -> int:
    """The header ``flags`` of a batch object of ``rows`` decode rows."""
    if not 1 <= rows <= MAX_SLOTS:
        raise TagError("rows", f"{rows} is outside 1..{MAX_SLOTS}")
    return BATCH | rows


def batch_rows(flags: int) -> int | None:
    """The row count of a batch object's ``flags``; None when ``flags`` is not the
    batch form (0, a single tag, or a prompt batch: :func:`prompt_count`). A word that
    has the BATCH bit but is not a valid batch form is a :class:`TagError`."""
    if flags & TAGGED or not flags & BATCH or flags & (PROMPTS | MIXED):
        return None
    rows = flags & BATCH_ROWS_MASK
    if flags >> 32 or flags & ~(BATCH | BATCH_ROWS_MASK) or not 1 <= rows <= MAX_SLOTS:
        raise TagError("flags", f"{flags:#x} is not a batch of 1..{MAX_SLOTS} rows")
    return rows


def batch_table(flags: int, words: Sequence[int], slots: int) -> tuple[SequenceTag, ...]:
    """The checked tag table of a batch object (module doc).

    ``words`` are the u32s at the head of its payload (at least the table; more is
    fine, they are the rows). Raises :class:`TagError` when ``flags`` is not a batch,
    its row count exceeds ``slots``, the payload is shorter than the table, or an entry
    is not a decode row's tag of a slot below ``slots``, or repeats a slot."""
    rows = batch_rows(flags)
    if rows is None:
        raise TagError("flags", f"{flags:#x} is not a batch object")
    if rows > slots:
        raise TagError("rows", f"{rows} rows exceed the {slots} slots")
    if len(words) < rows:
        raise TagError("table", f"{len(words)} words hold no table of {rows} tags")
    return _table(words, rows, slots, "position 0 (a prompt) in a batch")


def table_bytes(rows: int, row_bytes: int) -> int:
    """Bytes the tag table of a batch of ``rows`` takes on an edge whose rows (its
    ``ObjectSpec.alignment``) are ``row_bytes``: ``4 * rows`` rounded up to whole rows
    (module doc). The one place the padded size is computed: the orchestrator's writer,
    the worker's row count and output extents, and the stage role use it."""
    if rows < 1 or row_bytes < 1:
        raise TagError("rows", f"a table of {rows} tags in rows of {row_bytes} bytes")
    return -(-rows * TAG_WIDTH // row_bytes) * row_bytes


def answer_words(tag: SequenceTag) -> int:
    """u32s of the last stage's answer to one row: ``2 * CANDIDATES_K`` or one id."""
    return 2 * CANDIDATES_K if tag.candidates else 1


def max_batch_answer_words(slots: int) -> int:
    """u32s of the largest token-out object a serving run of ``slots`` can produce: a
    batch of ``slots`` rows, all asking for candidates, after its table."""
    return slots * (1 + 2 * CANDIDATES_K)


def prompt_flags(prompts: int) -> int:
    """The header ``flags`` of a prompt batch of ``prompts`` prompts."""
    if not 1 <= prompts <= MAX_PROMPTS:
        raise TagError("prompts", f"{prompts} is outside 1..{MAX_PROMPTS}")
    return BATCH | PROMPTS | prompts


def prompt_count(flags: int) -> int | None:
    """The prompt count of a prompt batch's ``flags``; None when ``flags`` is not one.
    A word with BATCH and PROMPTS set that is not a valid prompt batch is a
    :class:`TagError`."""
    if flags & TAGGED or not flags & BATCH or not flags & PROMPTS:
        return None
    count = flags & BATCH_ROWS_MASK
    if (flags >> 32 or flags & ~(BATCH | PROMPTS | BATCH_ROWS_MASK)
            or not 1 <= count <= MAX_PROMPTS):
        raise TagError("flags", f"{flags:#x} is not a prompt batch of 1..{MAX_PROMPTS} "
                       "prompts")
    return count


def mixed_flags(entries: int) -> int:
    """The header ``flags`` of a mixed step of ``entries`` entries: a prompt and
    ``entries - 1`` decode rows."""
    if not 2 <= entries <= MAX_SLOTS:
        raise TagError("entries", f"{entries} is outside 2..{MAX_SLOTS}")
    return BATCH | MIXED | entries


def mixed_count(flags: int) -> int | None:
    """The entries of a mixed step's ``flags`` (its prompt and its decode rows); None
    when ``flags`` is not one. A word with BATCH and MIXED set that is not a valid
    mixed step is a :class:`TagError`."""
    if flags & TAGGED or not flags & BATCH or not flags & MIXED:
        return None
    entries = flags & BATCH_ROWS_MASK
    if (flags >> 32 or flags & ~(BATCH | MIXED | BATCH_ROWS_MASK)
            or not 2 <= entries <= MAX_SLOTS):
        raise TagError("flags", f"{flags:#x} is not a mixed step of 2..{MAX_SLOTS} "
                       "entries")
    return entries


def mixed_table(flags: int, words: Sequence[int], slots: int) -> tuple[SequenceTag, ...]:
    """The checked table of a mixed step (module doc): the prompt's tag (``position``
    its row count), then each decode row's. Raises :class:`TagError` when ``flags`` is
    not a mixed step, its entries exceed ``slots``, ``words`` are fewer than its
    entries, or an entry is not a tag of a slot below ``slots`` with a non-zero
    position, or repeats a slot."""
    entries = mixed_count(flags)
    if entries is None:
        raise TagError("flags", f"{flags:#x} is not a mixed step")
    return _counted_table(words, entries, slots, "entries",
                          "a prompt of no rows, or a decode row at 0")


def table_entries(flags: int) -> int | None:
    """Entries of the tag table an object with ``flags`` starts with: a batch's rows, a
    prompt batch's prompts or a mixed step's entries; None for an object without a
    table (0, a single tag)."""
    rows = batch_rows(flags)
    if rows is not None:
        return rows
    count = prompt_count(flags)
    return count if count is not None else mixed_count(flags)


def prompt_table(flags: int, words: Sequence[int], slots: int) -> tuple[SequenceTag, ...]:
    """The checked table of a prompt batch (module doc): one tag per prompt, its
    ``position`` the prompt's row count. Raises :class:`TagError` when ``flags`` is not
    a prompt batch, its prompts exceed ``slots``, ``words`` are fewer than its
    entries, or an entry is not a tag of a slot below ``slots`` with at least one row,
    or repeats a slot."""
    count = prompt_count(flags)
    if count is None:
        raise TagError("flags", f"{flags:#x} is not a prompt batch")
    return _counted_table(words, count, slots, "prompts", "a prompt of no rows")


def read_table(flags: int, words: Sequence[int], slots: int) -> tuple[SequenceTag, ...]:
    """The checked table of a batch (:func:`batch_table`), a prompt batch
    (:func:`prompt_table`) or a mixed step (:func:`mixed_table`); :class:`TagError` for
    any other ``flags``."""
    if prompt_count(flags) is not None:
        return prompt_table(flags, words, slots)
    if mixed_count(flags) is not None:
        return mixed_table(flags, words, slots)
    return batch_table(flags, words, slots)


def _counted_table(words: Sequence[int], entries: int, slots: int, noun: str,
                   position_zero: str) -> tuple[SequenceTag, ...]:
    """A table of ``entries`` ``noun`` (its flags already read): no more than ``slots``,
    ``words`` holding them all, then each entry checked (:func:`_table`)."""
    if entries > slots:
        raise TagError(noun, f"{entries} {noun} exceed the {slots} slots")
    if len(words) < entries:
        raise TagError("table", f"{len(words)} words hold no table of {entries} {noun}")
    return _table(words, entries, slots, position_zero)


def _table(words: Sequence[int], entries: int, slots: int,
           position_zero: str) -> tuple[SequenceTag, ...]:
    """The first ``entries`` of ``words`` as tags, each of a distinct slot below ``slots``
    and a non-zero ``position``; ``position_zero`` says what a zero position would mean
    in this table."""
    tags: list[SequenceTag] = []
    seen: set[int] = set()
    for index in range(entries):
        word = int(words[index])
        if not word & TAGGED or word >> 32:
            raise TagError("table", f"entry {index} ({word:#x}) is not a sequence tag")
        tag = SequenceTag.unpack(word)
        assert tag is not None
        if tag.position == 0:
            raise TagError("table", f"entry {index}: {position_zero}")
        if tag.slot >= slots:
            raise TagError("table", f"entry {index}: slot {tag.slot} outside 0..{slots - 1}")
        if tag.slot in seen:
            raise TagError("table", f"entry {index}: slot {tag.slot} appears twice")
        seen.add(tag.slot)
        tags.append(tag)
    return tuple(tags)
