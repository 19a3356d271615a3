"""Cutting a model's blocks into contiguous stage ranges (spec §11 layer assignment).

Theory of operation. A split is a tuple of block counts, one per stage, in stage order;
stage `i` owns `[sum(counts[:i]), sum(counts[:i+1]))`, so the ranges are contiguous, do
not overlap and cover `0..blocks` by construction whenever every count is at least 1
and the counts sum to `blocks`.

- `explicit_split(counts, blocks, nodes)` checks a user's split (`--split 10,10,10`).
- `proportional_split(weights, blocks)` sizes stages in proportion to `weights` (the
  nodes' usable memory) by the largest-remainder method: each stage first gets
  `max(1, floor(quota))` blocks, then blocks are added to the stages with the largest
  remaining quota (or taken from the stages with the smallest, never below 1) until the
  sum is `blocks`. Ties favour the lower stage index (it gains first, loses last), so
  the result is deterministic.
  Exact rational arithmetic: no float rounding decides a block.
- `ranges(counts)` turns counts into `(start, end_exclusive)` pairs.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from swactor.orchestrator.errors import PlannerError, PlanProblem


def ranges(counts: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """`(layer_start, layer_end_exclusive)` per stage for block `counts` in stage order."""
    out: list[tuple[int, int]] = []
    start = 0
    for count in counts:
        out.append((start, start + count))
        start += count
    return tuple(out)


def explicit_split(counts: Sequence[int], blocks: int, nodes: int) -> tuple[int, ...]:
    """Check a user-given split against the model's block count and the pool size."""
    if not counts:
        raise PlannerError(PlanProblem.SplitInvalid, "the split is empty")
    for i, count in enumerate(counts):
        if count < 1:
            raise PlannerError(
                PlanProblem.SplitInvalid,
                f"stage {i} of the split has {count} blocks; every stage needs at least 1",
            )
    if len(counts) != nodes:
        raise PlannerError(
            PlanProblem.SplitNodeCountMismatch,
            f"the split has {len(counts)} stages but the pool has {nodes} nodes",
        )
    total = sum(counts)
    if total != blocks:
        raise PlannerError(
            PlanProblem.SplitSumMismatch,
            f"the split {','.join(map(str, counts))} sums to {total}, but the model has "
            f"{blocks} blocks",
        )
    return tuple(counts)


def proportional_split(weights: Sequence[int], blocks: int) -> tuple[int, ...]:
    """Block counts proportional to `weights` (all positive), each at least 1."""
    stages = len(weights)
    if stages == 0:
        raise PlannerError(PlanProblem.EmptyPool, "the pool has no nodes")
    if stages > blocks:
        raise PlannerError(
            PlanProblem.TooManyStages,
            f"{stages} stages but the model has only {blocks} blocks (at most one stage per "
            "block: use fewer nodes)",
        )
    if any(weight <= 0 for weight in weights):
        raise PlannerError(PlanProblem.ZeroMemoryNode, "every weight must be positive")
    total = sum(weights)
    quotas = [Fraction(blocks * weight, total) for weight in weights]
    counts = [max(1, int(quota)) for quota in quotas]
    while sum(counts) < blocks:
        best = max(range(stages), key=lambda i: (quotas[i] - counts[i], -i))
        counts[best] += 1
    while sum(counts) > blocks:
        shrinkable = [i for i in range(stages) if counts[i] > 1]
        worst = min(shrinkable, key=lambda i: (quotas[i] - counts[i], -i))
        counts[worst] -= 1
    return tuple(counts)
