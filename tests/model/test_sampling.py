"""Sampling policies: greedy, and seeded temperature / top-k / top-p."""

from __future__ import annotations

import numpy as np
import pytest

from swactor.model.sampling import SamplingPolicy, sample_token

LOGITS = np.array([0.5, 2.0, -1.0, 1.5, 0.0, 1.9], dtype=np.float32)


def test_greedy_is_argmax_with_lowest_id_on_ties() -> None:
    assert sample_token(LOGITS, SamplingPolicy.greedy(), 0) == 1
    assert sample_token(np.array([3.0, 1.0, 3.0]), SamplingPolicy(), 5) == 0


def test_same_seed_and_step_give_the_same_token() -> None:
    policy = SamplingPolicy.sample(temperature=1.5, seed=1234)
    draws = [sample_token(LOGITS, policy, step) for step in range(200)]
    assert draws == [sample_token(LOGITS, policy, step) for step in range(200)]
    other = SamplingPolicy.sample(temperature=1.5, seed=1235)
    assert draws != [sample_token(LOGITS, other, step) for step in range(200)]


def test_top_k_one_and_tiny_top_p_are_greedy() -> None:
    for step in range(50):
        assert sample_token(LOGITS, SamplingPolicy.sample(top_k=1, seed=step), step) == 1
        assert sample_token(LOGITS, SamplingPolicy.sample(top_p=1e-6, seed=step), step) == 1


def test_top_k_and_top_p_restrict_the_support() -> None:
    drawn_k = {sample_token(LOGITS, SamplingPolicy.sample(top_k=3, seed=9), s) for s in range(300)}
    assert drawn_k == {1, 5, 3}
    # softmax at T=1, sorted: id 1 ~0.343, id 5 ~0.310, id 3 ~0.208, then 0.076, 0.046, 0.017
    for top_p, support in ((0.6, {1, 5}), (0.8, {1, 5, 3})):
        policy = SamplingPolicy.sample(top_p=top_p, seed=9)
        assert {sample_token(LOGITS, policy, s) for s in range(300)} == support


def test_frequencies_follow_the_tempered_softmax() -> None:
    policy = SamplingPolicy.sample(temperature=0.7, seed=42)
    n = 4000
    counts = np.bincount([sample_token(LOGITS, policy, s) for s in range(n)], minlength=6)
    z = np.exp(LOGITS.astype(np.float64) / 0.7)
    expected = z / z.sum() * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 25.0  # 5 degrees of freedom: p < 0.001 above ~20.5


@pytest.mark.parametrize(
    "kwargs", [{"temperature": 0.0}, {"top_k": -1}, {"top_p": 0.0}, {"top_p": 1.5}, {"seed": -1}]
)
def test_bad_policies_are_rejected(kwargs: dict[str, float]) -> None:
    (field,) = kwargs
    with pytest.raises(ValueError, match=f"^{field} must be"):
        SamplingPolicy.sample(**kwargs)  # type: ignore[arg-type]
