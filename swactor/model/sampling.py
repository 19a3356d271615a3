"""Token sampling at the last stage (spec §10): greedy, or temperature / top-k / top-p.

Theory of operation: the last stage turns the final position's logits (``float32``,
``[vocab]``) into one token id. Greedy is ``argmax`` (lowest id on ties). Stochastic
sampling scales by ``1/temperature``, keeps the ``top_k`` largest logits (0 = all), then the
smallest prefix of the probability-sorted tokens whose mass reaches ``top_p`` (1.0 = all),
renormalises and draws once. The draw uses a generator seeded by ``(seed, step)``, so a
given seed gives the same token at the same inference step on every machine and after any
pipeline split, independent of what ran before.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt


class SamplingKind(enum.Enum):
    GREEDY = "greedy"
    SAMPLE = "sample"


@dataclass(frozen=True)
class SamplingPolicy:
    """How the last stage picks a token; ``SamplingPolicy()`` is greedy."""

    kind: SamplingKind = SamplingKind.GREEDY
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind is SamplingKind.SAMPLE:
            if not self.temperature > 0.0:
                raise ValueError(f"temperature must be > 0, got {self.temperature}")
            if self.top_k < 0:
                raise ValueError(f"top_k must be >= 0, got {self.top_k}")
            if not 0.0 < self.top_p <= 1.0:
                raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
            if self.seed < 0:
                raise ValueError(f"seed must be >= 0, got {self.seed}")

    @classmethod
    def greedy(cls) -> SamplingPolicy:
        return cls()

    @classmethod
    def sample(
        cls, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0
    ) -> SamplingPolicy:
        return cls(SamplingKind.SAMPLE, temperature, top_k, top_p, seed)


def sample_token(logits: npt.NDArray[Any], policy: SamplingPolicy, step: int) -> int:
    """Pick one token id from a ``[vocab]`` logits vector for inference step ``step``."""
    values = np.asarray(logits, dtype=np.float64).reshape(-1)
    if policy.kind is SamplingKind.GREEDY:
        return int(np.argmax(values))
    scaled = values / policy.temperature
    order = np.argsort(-scaled, kind="stable")
    if policy.top_k > 0:
        order = order[: policy.top_k]
    kept = scaled[order]
    probs = np.exp(kept - kept.max())
    probs /= probs.sum()
    if policy.top_p < 1.0:
        cumulative = np.cumsum(probs)
        cut = int(np.searchsorted(cumulative, policy.top_p, side="left")) + 1
        order, probs = order[:cut], probs[:cut] / probs[:cut].sum()
    rng = np.random.default_rng([policy.seed, step])
    return int(order[int(rng.choice(len(order), p=probs))])
