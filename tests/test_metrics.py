"""Metrics against definitions computed the slow way."""

import itertools

import numpy as np
import pytest

from training.bootstrap import percentile_interval, stratified_draws
from training.metrics import (
    _example_nll,
    _resampled_ece,
    classification_metrics,
    confidence_intervals,
    nll,
    reliability,
    roc_auc,
    wilson_interval,
)


def auc_by_pairs(scores, labels):
    pos, neg = scores[labels == 1], scores[labels == 0]
    wins = sum((p > n) + 0.5 * (p == n) for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", range(5))
def test_auc_equals_pairwise_definition_with_ties(seed):
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 6, 40) / 5.0  # many ties
    labels = rng.integers(0, 2, 40)
    assert roc_auc(scores, labels) == pytest.approx(auc_by_pairs(scores, labels), abs=1e-12)


def test_auc_extremes_and_single_class():
    labels = np.array([0, 0, 1, 1])
    assert roc_auc(np.array([0.1, 0.2, 0.8, 0.9]), labels) == 1.0
    assert roc_auc(np.array([0.9, 0.8, 0.2, 0.1]), labels) == 0.0
    assert np.isnan(roc_auc(np.array([0.1, 0.2]), np.array([1, 1])))


def test_reliability_bins_and_ece():
    # Two bins used: confidence 0.95 (all right) and 0.6 (half right).
    probs = np.array([[0.95, 0.05]] * 4 + [[0.6, 0.4]] * 4)
    labels = np.array([0, 0, 0, 0, 0, 0, 1, 1])
    curve = reliability(probs, labels, bins=10)
    assert sum(curve["count"]) == 8
    assert curve["count"][9] == 4 and curve["count"][5] == 4
    assert curve["accuracy"][9] == 1.0 and curve["accuracy"][5] == 0.5
    assert curve["confidence"][0] is None
    assert curve["ece"] == pytest.approx(0.5 * 0.05 + 0.5 * 0.1)


def test_classification_metrics():
    probs = np.array([[0.7, 0.3], [0.2, 0.8], [0.6, 0.4]])
    labels = np.array([0, 1, 1])
    metrics = classification_metrics(probs, labels, calibration=True)
    assert metrics["error"] == pytest.approx(1 / 3)
    assert metrics["nll"] == pytest.approx(-(np.log(0.7) + np.log(0.8) + np.log(0.4)) / 3)
    assert metrics["auc"] == pytest.approx(1.0)
    assert nll(np.array([[1.0, 0.0]]), np.array([1])) == pytest.approx(-np.log(1e-12))


def test_wilson_interval_matches_published_values():
    # Newcombe (1998), Table I: 81 of 263 -> 0.2553 to 0.3662; 15 of 148 -> 0.0624 to 0.1605.
    assert wilson_interval(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)
    assert wilson_interval(15, 148) == pytest.approx((0.0624, 0.1605), abs=1e-4)
    low, high = wilson_interval(0, 10)
    assert low == pytest.approx(0.0, abs=1e-12) and 0.27 < high < 0.28


def test_confidence_intervals_bracket_their_values_and_shrink_with_more_data():
    rng = np.random.default_rng(0)

    def sample(n):
        labels = np.arange(n) % 2
        p = np.clip(0.5 + 0.3 * (2 * labels - 1) + 0.3 * rng.standard_normal(n), 0.01, 0.99)
        return np.stack([1 - p, p], axis=1), labels

    small, large = confidence_intervals(*sample(60)), confidence_intervals(*sample(2000))
    for name in ("accuracy", "error", "auc", "nll", "ece"):
        for result in (small, large):
            assert result[name]["low"] <= result[name]["value"] <= result[name]["high"], name
        widths = [result[name]["high"] - result[name]["low"] for result in (large, small)]
        assert widths[0] < widths[1], f"{name}: more data, narrower interval"
    assert small["accuracy"]["value"] == pytest.approx(1 - small["error"]["value"])
    perfect = confidence_intervals(np.array([[0.9, 0.1], [0.2, 0.8]] * 5), np.array([0, 1] * 5))
    assert perfect["auc"]["low"] == perfect["auc"]["high"] == 1.0


def test_every_resampled_statistic_is_the_metric_of_its_resample():
    """The intervals' resampled NLL and ECE (computed for every resample at once) are nll and reliability's ECE of
    each row of the shared stratified draws, and the AUC interval is the percentile interval of those rows."""
    rng = np.random.default_rng(4)
    labels = (rng.random(300) < 0.4).astype(int)
    p = np.clip(0.5 + 0.35 * (2 * labels - 1) + 0.3 * rng.standard_normal(300), 0.001, 0.999)
    probs = np.stack([1 - p, p], axis=1)
    draws = stratified_draws(labels, 40, seed=9)
    np.testing.assert_allclose(_resampled_ece(probs, labels, draws),
                               [reliability(probs[row], labels[row])["ece"] for row in draws], rtol=0, atol=1e-12)
    np.testing.assert_allclose(_example_nll(probs, labels)[draws].mean(axis=1),
                               [nll(probs[row], labels[row]) for row in draws], rtol=1e-12)
    intervals = confidence_intervals(probs, labels, resamples=40, seed=9)
    expected = percentile_interval([roc_auc(probs[row, 1], labels[row]) for row in draws])
    assert (intervals["auc"]["low"], intervals["auc"]["high"]) == pytest.approx(expected, abs=1e-12)
    assert intervals["nll"]["method"] == "stratified bootstrap (training.bootstrap), 40 resamples, seed 9"
