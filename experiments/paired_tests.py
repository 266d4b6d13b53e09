"""Paired tests of two classifiers on the same test examples: does model A beat model B on these patches?

Both tests condition on the test set: they ask whether A's advantage on these very patches is larger than the
patch-to-patch noise of a set this size, not how a retrained A would fare against a retrained B.

- Accuracy: the exact McNemar test. Only the discordant patches carry information: ``b`` patches A gets right and
  B wrong, ``c`` the other way round. If neither model is the better, each discordant patch is a fair coin, so
  b ~ Binomial(b + c, 1/2), and the one-sided p of "A beats B" is P(X >= b). The p is the exact binomial tail,
  not the mid-p variant (which subtracts half of P(X = b) and is smaller); with no discordant patch it is 1.
- AUC: a paired bootstrap of the AUC difference. Every resample draws the patches with replacement, the same
  draw for both models (so their correlation is kept), within each class (so the class counts, and with them
  the AUC's definition, are kept: as every interval of the project: :mod:`training.bootstrap`). The one-sided p
  of "A beats B" is the fraction of resamples whose difference AUC_A - AUC_B is below zero, a difference of
  exactly zero counting one half (two identical models: p = 1/2 exactly). A p of 0 means no resample went the
  other way: p < 1 / resamples. The 95 % interval is the percentile interval of the differences.

A claim holds when its one-sided p is below :data:`experiments.table1_claims.LEVEL` (0.05), is reversed when the p
of the other direction is, and is otherwise not resolved; the wording is the Table 1 claims'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from training.bootstrap import RESAMPLES, SEED, percentile_interval, resampled_aucs, stratified_draws

from .table1_claims import LEVEL

__all__ = ["McNemar", "AucDifference", "mcnemar", "binomial_tail", "paired_auc_bootstrap", "verdict"]


def binomial_tail(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2), exactly: the sum of C(n, j) over j >= k, over 2^n (integers, then one
    correctly rounded division, so that n in the thousands loses nothing)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return sum(math.comb(n, j) for j in range(k, n + 1)) / 2**n


@dataclass(frozen=True)
class McNemar:
    """The exact McNemar test of "A is right more often than B" on paired correct/incorrect outcomes.

    Attributes:
        both: patches both models get right.
        only_a: patches A gets right and B wrong (b).
        only_b: patches B gets right and A wrong (c).
        neither: patches both get wrong.
        p: one-sided p of "A beats B", P(X >= b) for X ~ Binomial(b + c, 1/2).
        p_reversed: one-sided p of "B beats A", P(X >= c).
    """

    both: int
    only_a: int
    only_b: int
    neither: int
    p: float
    p_reversed: float

    @property
    def total(self) -> int:
        return self.both + self.only_a + self.only_b + self.neither

    def as_dict(self) -> dict:
        return {"both_right": self.both, "only_a_right": self.only_a, "only_b_right": self.only_b,
                "both_wrong": self.neither, "p": self.p, "p_reversed": self.p_reversed}


def mcnemar(a_correct: np.ndarray, b_correct: np.ndarray) -> McNemar:
    """Exact one-sided McNemar test of "A beats B" from each patch's correct (True) or wrong outcome.

    Args:
        a_correct, b_correct: booleans, one per test patch, in the same order.
    """
    a, b = np.asarray(a_correct, dtype=bool), np.asarray(b_correct, dtype=bool)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired outcomes must be two vectors of one length, got {a.shape} and {b.shape}")
    only_a, only_b = int((a & ~b).sum()), int((~a & b).sum())
    discordant = only_a + only_b
    return McNemar(both=int((a & b).sum()), only_a=only_a, only_b=only_b, neither=int((~a & ~b).sum()),
                   p=binomial_tail(only_a, discordant), p_reversed=binomial_tail(only_b, discordant))


@dataclass(frozen=True)
class AucDifference:
    """A paired bootstrap of AUC_A - AUC_B on the same test patches.

    Attributes:
        auc_a, auc_b: the two AUCs on the test patches themselves.
        low, high: 95 % percentile interval of the resampled differences.
        p: one-sided p of "A's AUC beats B's": the fraction of resampled differences below 0, those at exactly
            0 counting half.
        p_reversed: the same for "B's beats A's"; ``p + p_reversed == 1``.
        resamples, seed: how the resamples were drawn (:func:`training.bootstrap.stratified_draws`).
    """

    auc_a: float
    auc_b: float
    low: float
    high: float
    p: float
    p_reversed: float
    resamples: int
    seed: int

    @property
    def difference(self) -> float:
        return self.auc_a - self.auc_b

    def as_dict(self) -> dict:
        return {"auc_a": self.auc_a, "auc_b": self.auc_b, "difference": self.difference, "low": self.low,
                "high": self.high, "p": self.p, "p_reversed": self.p_reversed, "resamples": self.resamples,
                "seed": self.seed}


def paired_auc_bootstrap(scores_a: np.ndarray, scores_b: np.ndarray, labels: np.ndarray, *,
                         resamples: int = RESAMPLES, seed: int = SEED) -> AucDifference:
    """Paired stratified bootstrap of the difference of two models' ROC AUCs on the same test examples.

    Args:
        scores_a, scores_b: each model's score of the positive class (e.g. tumour probability), one per example.
        labels: 0 / 1, one per example; both classes present.
    """
    labels = np.asarray(labels)
    if not len(scores_a) == len(scores_b) == len(labels):
        raise ValueError(f"paired scores need one length, got {len(scores_a)}, {len(scores_b)} and {len(labels)}")
    if len(np.unique(labels)) != 2:
        raise ValueError("an AUC needs both classes among the labels")
    every = np.arange(len(labels))[None, :]
    auc_a = float(resampled_aucs(scores_a, labels, every)[0])
    auc_b = float(resampled_aucs(scores_b, labels, every)[0])
    draws = stratified_draws(labels, resamples, seed)
    differences = resampled_aucs(scores_a, labels, draws) - resampled_aucs(scores_b, labels, draws)
    below, tied = int((differences < 0).sum()), int((differences == 0).sum())
    low, high = percentile_interval(differences)
    return AucDifference(auc_a=auc_a, auc_b=auc_b, low=low, high=high,
                         p=(below + tied / 2) / resamples, p_reversed=(resamples - below - tied / 2) / resamples,
                         resamples=resamples, seed=seed)


def verdict(p: float, p_reversed: float, ahead: float) -> str:
    """Wording of a one-sided paired claim, as the Table 1 claims word theirs.

    Args:
        p: one-sided p in the claim's direction; ``p_reversed`` the other direction's.
        ahead: A's advantage on the test patches (positive: A ahead, as claimed; 0: tied).
    """
    if p < LEVEL:
        return "holds"
    if p_reversed < LEVEL:
        return "reversed"
    leaning = "ahead" if ahead > 0 else "behind" if ahead < 0 else "tied"
    return f"not resolved ({leaning}, within the test patches' noise)"
