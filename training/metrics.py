"""Classification metrics from predicted probabilities: error, NLL, ROC AUC, calibration (ECE, reliability)."""

from __future__ import annotations

import numpy as np

from .bootstrap import RESAMPLES, SEED, describe, percentile_interval, resampled_aucs, stratified_draws

__all__ = ["error_rate", "nll", "roc_auc", "reliability", "classification_metrics", "wilson_interval",
           "confidence_intervals"]


def error_rate(probs: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(probs.argmax(axis=1) != labels))


def nll(probs: np.ndarray, labels: np.ndarray) -> float:
    """Mean negative log-likelihood of the true labels (probabilities clipped at 1e-12)."""
    return float(_example_nll(probs, labels).mean())


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` for the positive class ``labels == 1``.

    The Mann-Whitney statistic with tied scores counted half: the probability
    that a random positive scores above a random negative.
    """
    positives = labels == 1
    n_pos, n_neg = int(positives.sum()), int((~positives).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(len(scores))
    # Average rank within each run of equal scores.
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_scores)) + 1]
    ends = np.r_[starts[1:], len(scores)]
    for start, end in zip(starts, ends, strict=True):
        ranks[order[start:end]] = (start + end + 1) / 2
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _bins(confidence: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``bins + 1`` equal-width edges over [0, 1] and each confidence's bin: bin i holds (edges[i], edges[i+1]]
    (a confidence of exactly 0 cannot occur for a max probability)."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    return edges, np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, bins - 1)


def reliability(probs: np.ndarray, labels: np.ndarray, bins: int = 15) -> dict:
    """Confidence (max probability) against accuracy in equal-width bins, and the expected calibration error.

    Returns:
        ``{"ece", "bin_edges", "confidence", "accuracy", "count"}``; empty bins have
        confidence and accuracy ``None``. ECE = sum over bins of count/N * |accuracy - confidence|.
    """
    confidence = probs.max(axis=1)
    correct = probs.argmax(axis=1) == labels
    edges, index = _bins(confidence, bins)
    out = {"bin_edges": edges.tolist(), "confidence": [], "accuracy": [], "count": []}
    ece = 0.0
    for i in range(bins):
        members = index == i
        count = int(members.sum())
        out["count"].append(count)
        if count == 0:
            out["confidence"].append(None)
            out["accuracy"].append(None)
            continue
        conf, acc = float(confidence[members].mean()), float(correct[members].mean())
        out["confidence"].append(conf)
        out["accuracy"].append(acc)
        ece += count / len(labels) * abs(acc - conf)
    out["ece"] = float(ece)
    return out


def classification_metrics(probs: np.ndarray, labels: np.ndarray, *, calibration: bool = False) -> dict:
    """Error and NLL; with ``calibration`` (binary tasks: PCam, H&E) also AUC, ECE and reliability data."""
    metrics = {"error": error_rate(probs, labels), "nll": nll(probs, labels), "count": int(len(labels))}
    if calibration:
        curve = reliability(probs, labels)
        metrics["ece"] = curve.pop("ece")
        metrics["reliability"] = curve
        if probs.shape[1] == 2:
            metrics["auc"] = roc_auc(probs[:, 1], labels)
    return metrics


def wilson_interval(successes: int, total: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95 % for the default ``z``)."""
    if total == 0:
        return float("nan"), float("nan")
    p = successes / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * np.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return float(centre - half), float(centre + half)


def confidence_intervals(probs: np.ndarray, labels: np.ndarray, *, resamples: int = RESAMPLES,
                         seed: int = SEED) -> dict:
    """95 % intervals of a binary classifier's test metrics.

    Accuracy and error: Wilson score intervals. AUC, NLL and ECE: percentile intervals over one set of
    :func:`training.bootstrap.stratified_draws` (every resample keeps the class counts, so its AUC is defined),
    each statistic computed on the same resamples.

    Returns:
        ``{metric: {"value", "low", "high", "method"}}`` for accuracy, error, auc, nll and ece.
    """
    labels = np.asarray(labels)
    correct = int((probs.argmax(axis=1) == labels).sum())
    n = len(labels)
    out = {}
    low, high = wilson_interval(correct, n)
    out["accuracy"] = {"value": correct / n, "low": low, "high": high, "method": "Wilson"}
    out["error"] = {"value": 1 - correct / n, "low": 1 - high, "high": 1 - low, "method": "Wilson"}
    draws = stratified_draws(labels, resamples, seed)  # (R, N)
    resampled = {"auc": resampled_aucs(probs[:, 1], labels, draws),
                 "nll": _example_nll(probs, labels)[draws].mean(axis=1),
                 "ece": _resampled_ece(probs, labels, draws)}
    values = {"auc": roc_auc(probs[:, 1], labels), "nll": nll(probs, labels),
              "ece": reliability(probs, labels)["ece"]}
    for name, value in values.items():
        low, high = percentile_interval(resampled[name])
        out[name] = {"value": float(value), "low": low, "high": high, "method": describe(resamples, seed)}
    return out


def _example_nll(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each example's negative log-likelihood, the true label's probability clipped at 1e-12: ``(N,)``."""
    return -np.log(np.clip(probs[np.arange(len(labels)), labels], 1e-12, None))


def _resampled_ece(probs: np.ndarray, labels: np.ndarray, draws: np.ndarray, bins: int = 15) -> np.ndarray:
    """:func:`reliability`'s ECE of every resample at once: per bin, |sum of correct - sum of confidence| / N.

    Shape:
        draws ``(R, N)``; returns ``(R,)``.
    """
    confidence = probs.max(axis=1)
    correct = (probs.argmax(axis=1) == labels).astype(np.float64)
    _, index = _bins(confidence, bins)
    resamples = draws.shape[0]
    flat = (index[draws] + bins * np.arange(resamples)[:, None]).ravel()  # (R * N,): one bin per (resample, bin)
    gap = (np.bincount(flat, correct[draws].ravel(), resamples * bins)
           - np.bincount(flat, confidence[draws].ravel(), resamples * bins)).reshape(resamples, bins)
    return np.abs(gap).sum(axis=1) / draws.shape[1]
