"""The one stratified bootstrap over test examples, shared by every interval and paired test of the project.

A resample draws the N test examples with replacement *within each class*, so that it keeps the class counts:
an AUC is defined on every resample, and the resampled statistics vary only as a test set of that make-up
would. The draws are one ``(resamples, N)`` array of indices from ``numpy.random.default_rng(seed)``, drawn
class by class in label order; every statistic of one call (a card's AUC, NLL and ECE; two models' paired AUCs;
several seeds' paired accuracies) is computed on the same rows, so that their resampled values are paired.
:func:`training.metrics.confidence_intervals` and :mod:`experiments.paired_tests` draw through here.
"""

from __future__ import annotations

import numpy as np

__all__ = ["RESAMPLES", "SEED", "stratified_draws", "resampled_aucs", "percentile_interval", "describe"]

RESAMPLES, SEED = 2000, 0


def stratified_draws(labels: np.ndarray, resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """Indices of ``resamples`` bootstrap resamples of the examples, each drawn with replacement within its class.

    Shape:
        labels ``(N,)``; returns ``(resamples, N)``, each row holding every class's count of indices (the
        classes side by side in label order).
    """
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    classes = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    # (resamples, count of the class) each, side by side: (resamples, N).
    return np.concatenate([members[rng.integers(0, len(members), size=(resamples, len(members)))]
                           for members in classes], axis=1)


def resampled_aucs(scores: np.ndarray, labels: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """The ROC AUC of ``scores`` (positive class ``labels == 1``) on each resample, ties counted half.

    The same statistic as :func:`training.metrics.roc_auc` on ``scores[row], labels[row]`` for each row of
    ``draws``, for every row at once: each resample's counts of positives and negatives at each distinct score,
    then each positive's negatives below it plus half those tied with it.

    Shape:
        draws ``(R, M)`` indices into ``scores``; returns ``(R,)``.
    """
    scores, labels, draws = np.asarray(scores), np.asarray(labels), np.atleast_2d(draws)
    distinct, level = np.unique(scores, return_inverse=True)
    resamples, width = draws.shape[0], len(distinct)
    drawn_level = level[draws]  # (R, M): each draw's rank among the distinct scores
    positive = labels[draws] == 1
    flat = drawn_level + width * np.arange(resamples)[:, None]  # (R, M): one bin per (resample, distinct score)
    pos = np.bincount(flat[positive], minlength=resamples * width).reshape(resamples, width)
    neg = np.bincount(flat[~positive], minlength=resamples * width).reshape(resamples, width)
    below = np.cumsum(neg, axis=1) - neg  # (R, K): negatives strictly below each distinct score
    n_pos, n_neg = pos.sum(axis=1), neg.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (pos * (below + 0.5 * neg)).sum(axis=1) / (n_pos * n_neg)


def percentile_interval(resampled: np.ndarray) -> tuple[float, float]:
    """The 95 % percentile interval (2.5th and 97.5th percentiles, numpy's linear rule) of resampled values."""
    low, high = np.percentile(resampled, [2.5, 97.5])
    return float(low), float(high)


def describe(resamples: int = RESAMPLES, seed: int = SEED) -> str:
    """How an interval was drawn, as a card's ``method`` names it."""
    return f"stratified bootstrap (training.bootstrap), {resamples} resamples, seed {seed}"
