"""Classification metrics from predicted probabilities: error, NLL, ROC AUC, calibration (ECE, reliability)."""

from __future__ import annotations

import numpy as np

__all__ = ["error_rate", "nll", "roc_auc", "reliability", "classification_metrics", "wilson_interval",
           "confidence_intervals"]


def error_rate(probs: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(probs.argmax(axis=1) != labels))


def nll(probs: np.ndarray, labels: np.ndarray) -> float:
    """Mean negative log-likelihood of the true labels (probabilities clipped at 1e-12)."""
    return float(-np.mean(np.log(np.clip(probs[np.arange(len(labels)), labels], 1e-12, None))))


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


def reliability(probs: np.ndarray, labels: np.ndarray, bins: int = 15) -> dict:
    """Confidence (max probability) against accuracy in equal-width bins, and the expected calibration error.

    Returns:
        ``{"ece", "bin_edges", "confidence", "accuracy", "count"}``; empty bins have
        confidence and accuracy ``None``. ECE = sum over bins of count/N * |accuracy - confidence|.
    """
    confidence = probs.max(axis=1)
    correct = probs.argmax(axis=1) == labels
    edges = np.linspace(0.0, 1.0, bins + 1)
    # Bin i holds (edges[i], edges[i+1]]; a confidence of exactly 0 cannot occur for a max probability.
    index = np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, bins - 1)
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


def confidence_intervals(probs: np.ndarray, labels: np.ndarray, *, resamples: int = 2000, seed: int = 0) -> dict:
    """95 % intervals of a binary classifier's test metrics.

    Accuracy and error: Wilson score intervals. AUC, NLL and ECE: percentile bootstrap over the test examples,
    resampled within each class (so that every resample keeps the class counts and its AUC is defined).

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
    statistics = {"auc": lambda p, y: roc_auc(p[:, 1], y), "nll": nll, "ece": lambda p, y: reliability(p, y)["ece"]}
    rng = np.random.default_rng(seed)
    classes = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    draws = {name: [] for name in statistics}
    for _ in range(resamples):
        index = np.concatenate([rng.choice(members, size=len(members)) for members in classes])
        for name, statistic in statistics.items():
            draws[name].append(statistic(probs[index], labels[index]))
    for name, statistic in statistics.items():
        low, high = np.percentile(draws[name], [2.5, 97.5])
        out[name] = {"value": float(statistic(probs, labels)), "low": float(low), "high": float(high),
                     "method": f"stratified bootstrap, {resamples} resamples"}
    return out
