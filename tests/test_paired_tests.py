"""The paired tests behind Table 3's claims: exact McNemar tails by hand, the bootstrap's AUC against
training.metrics.roc_auc, its p on pairs whose answer is known, and the verdicts' wording."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from experiments.paired_tests import (
    binomial_tail,
    mcnemar,
    paired_auc_bootstrap,
    verdict,
)
from training.bootstrap import resampled_aucs, stratified_draws
from training.metrics import roc_auc


def outcomes(both: int, only_a: int, only_b: int, neither: int) -> tuple[np.ndarray, np.ndarray]:
    """Correct / wrong of A and B on a made-up test set with these four counts."""
    a = np.array([True] * both + [True] * only_a + [False] * only_b + [False] * neither)
    b = np.array([True] * both + [False] * only_a + [True] * only_b + [False] * neither)
    return a, b


def test_mcnemar_b10_c2_is_the_binomial_tail_by_hand():
    result = mcnemar(*outcomes(50, 10, 2, 7))
    assert (result.both, result.only_a, result.only_b, result.neither, result.total) == (50, 10, 2, 7, 69)
    # P(X >= 10), X ~ Bin(12, 1/2): (C(12,10) + C(12,11) + C(12,12)) / 2^12 = (66 + 12 + 1) / 4096.
    assert result.p == 79 / 4096
    # The other direction: P(X >= 2) = 1 - (C(12,0) + C(12,1)) / 2^12.
    assert result.p_reversed == 1 - 13 / 4096
    mid_p = (79 - 66 / 2) / 4096
    assert result.p != mid_p, "the exact tail, not the mid-p"


def test_mcnemar_symmetric_counts_give_equal_ps_and_swapping_models_swaps_them():
    a, b = outcomes(30, 5, 5, 4)
    result = mcnemar(a, b)
    # P(X >= 5), X ~ Bin(10, 1/2) = (252 + 210 + 120 + 45 + 10 + 1) / 1024.
    assert result.p == result.p_reversed == 638 / 1024
    forward, backward = mcnemar(*outcomes(3, 9, 4, 1)), mcnemar(*outcomes(3, 4, 9, 1))
    assert (forward.p, forward.p_reversed) == (backward.p_reversed, backward.p)


def test_mcnemar_when_the_models_always_agree_is_one_both_ways():
    result = mcnemar(*outcomes(40, 0, 0, 11))
    assert result.p == result.p_reversed == 1.0
    assert verdict(result.p, result.p_reversed, 0).startswith("not resolved (tied")


def test_mcnemar_ignores_the_concordant_patches():
    assert mcnemar(*outcomes(5, 8, 1, 0)).p == mcnemar(*outcomes(500, 8, 1, 300)).p


def test_mcnemar_refuses_unpaired_outcomes():
    with pytest.raises(ValueError, match="one length"):
        mcnemar(np.ones(5, bool), np.ones(6, bool))


@pytest.mark.parametrize("n", [0, 1, 2, 7, 13, 30])
def test_binomial_tail_is_exact_for_every_k(n):
    for k in range(-1, n + 2):
        exact = sum((Fraction(math.comb(n, j), 2**n) for j in range(max(k, 0), n + 1)), Fraction(0))
        assert binomial_tail(k, n) == float(exact), (k, n)


def test_binomial_tail_over_the_whole_test_set_neither_overflows_nor_loses_the_tails():
    n = 1944
    assert binomial_tail(0, n) == 1.0 and binomial_tail(n + 1, n) == 0.0
    assert binomial_tail(n, n) == 0.0  # 2^-1944, below the smallest float: rounded, not an OverflowError
    assert binomial_tail(1100, n) + binomial_tail(n - 1099, n) == pytest.approx(1.0, abs=1e-15)
    assert 0 < binomial_tail(1100, n) < 1e-8


def scored_patches(seed: int, n: int = 600, ties: bool = False):
    """Labels and two models' scores: A separates the classes clearly better than B."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    a = rng.normal(size=n) + 2.0 * labels
    b = rng.normal(size=n) + 0.5 * labels
    if ties:
        a, b = np.round(a, 1), np.round(b, 1)
    return labels, a, b


@pytest.mark.parametrize("ties", [False, True])
def test_resampled_aucs_are_roc_auc_of_each_resample(ties):
    labels, a, _ = scored_patches(1, n=300, ties=ties)
    draws = stratified_draws(labels, 25, seed=3)
    expected = [roc_auc(a[row], labels[row]) for row in draws]
    np.testing.assert_allclose(resampled_aucs(a, labels, draws), expected, rtol=0, atol=1e-12)
    assert resampled_aucs(a, labels, np.arange(len(labels))[None])[0] == pytest.approx(roc_auc(a, labels), abs=1e-12)


def test_stratified_draws_keep_the_class_counts_and_follow_the_seed():
    labels = np.array([0] * 70 + [1] * 30)
    draws = stratified_draws(labels, 40, seed=5)
    assert draws.shape == (40, 100)
    assert ((labels[draws] == 1).sum(axis=1) == 30).all()
    np.testing.assert_array_equal(draws, stratified_draws(labels, 40, seed=5))
    assert not np.array_equal(draws, stratified_draws(labels, 40, seed=6))


def test_bootstrap_finds_the_clearly_better_model_and_not_the_other_way():
    labels, a, b = scored_patches(2)
    better = paired_auc_bootstrap(a, b, labels, resamples=500, seed=0)
    assert better.p < 0.01 and better.p_reversed > 0.99
    assert 0 < better.low < better.difference < better.high
    assert better.auc_a == pytest.approx(roc_auc(a, labels), abs=1e-12)
    assert verdict(better.p, better.p_reversed, better.difference) == "holds"
    worse = paired_auc_bootstrap(b, a, labels, resamples=500, seed=0)
    assert worse.p == better.p_reversed and worse.p_reversed == better.p
    assert verdict(worse.p, worse.p_reversed, worse.difference) == "reversed"


def test_bootstrap_of_a_model_against_itself_is_exactly_one_half():
    labels, a, _ = scored_patches(3, ties=True)
    same = paired_auc_bootstrap(a, a.copy(), labels, resamples=300, seed=1)
    assert same.p == same.p_reversed == 0.5
    assert same.difference == same.low == same.high == 0.0
    assert verdict(same.p, same.p_reversed, same.difference) == "not resolved (tied, within the test patches' noise)"


def test_bootstrap_refuses_unpaired_or_one_class_sets():
    labels, a, b = scored_patches(4, n=50)
    with pytest.raises(ValueError, match="one length"):
        paired_auc_bootstrap(a, b[:-1], labels)
    with pytest.raises(ValueError, match="both classes"):
        paired_auc_bootstrap(a, b, np.ones_like(labels))


def test_verdicts_are_worded_as_the_table1_claims_at_level_005():
    assert verdict(0.049, 0.96, 3) == "holds"
    assert verdict(0.05, 0.95, 3) == "not resolved (ahead, within the test patches' noise)"
    assert verdict(0.97, 0.03, -4) == "reversed"
    assert verdict(0.7, 0.4, -1) == "not resolved (behind, within the test patches' noise)"
