"""Committed numbers against their recomputation on this machine: equal to round-off, not bit for bit.

A record or card made on one CPU and recomputed on another need not agree in the last binary digit: numpy and
PyTorch sum in another order on another vector width (AVX-512 against AVX2: 16 or 8 float32 lanes, other
accumulator trees; measured, issue 58: the upper bound of an NLL interval moved from 0.2908677966854976 to
0.29086779668549767). Exact comparison then fails on a laptop for no fault of the record. What a stale record
looks like is far larger: an interval recorded again with other draws moves by 1e-4 and more, a metric of another
checkpoint by more still. The tolerances below sit between the two, and are stated once, here.

``make test-avx2`` runs the suite with AVX2-only code on an AVX-512 machine, where these differences show.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

__all__ = ["FLOAT64_STATISTIC", "FLOAT64_FLOOR", "TIE_LOG_RATIO", "assert_same_numbers", "differences", "near_ties",
           "classes_of_digest"]

# A float64 statistic (a mean, a percentile of bootstrap draws, an AUC) recomputed from the same stored inputs:
# a few hundred additions in another order move it by a few ulps (1e-16 relative each); 1e-12 leaves a thousand
# times that, and is 1e8 times below a re-recorded bound's 1e-4.
FLOAT64_STATISTIC = 1e-12
# Numbers that are differences of order-one quantities (a paired AUC difference, an interval bound near 0) carry an
# absolute round-off of a few ulps of the quantities they were made of (2.2e-16 each), not of themselves.
FLOAT64_FLOOR = 1e-14


def differences(measured, recorded, *, rel: float = FLOAT64_STATISTIC, floor: float = FLOAT64_FLOOR,
                where: str = "") -> list[str]:
    """Where ``measured`` and ``recorded`` (nested dicts, lists, numbers, strings) differ beyond round-off.

    Floats agree when ``|a - b| <= max(rel * max(|a|, |b|), floor)``; everything else (strings, ints, bools,
    keys, lengths) must be equal. Returns one line per difference, naming its place (``nll.high``).
    """
    if isinstance(measured, Mapping) and isinstance(recorded, Mapping):
        if set(measured) != set(recorded):
            return [f"{where or 'top'}: keys {sorted(measured)} against recorded {sorted(recorded)}"]
        return [line for key in measured
                for line in differences(measured[key], recorded[key], rel=rel, floor=floor,
                                        where=f"{where}.{key}" if where else str(key))]
    if _is_list(measured) and _is_list(recorded):
        if len(measured) != len(recorded):
            return [f"{where}: {len(measured)} items against {len(recorded)} recorded"]
        return [line for i, (a, b) in enumerate(zip(measured, recorded, strict=True))
                for line in differences(a, b, rel=rel, floor=floor, where=f"{where}[{i}]")]
    if isinstance(measured, float) or isinstance(recorded, float):
        if _is_number(measured) and _is_number(recorded) and _close(float(measured), float(recorded), rel, floor):
            return []
    elif measured == recorded and type(measured) is type(recorded):
        return []
    return [f"{where}: {measured!r} now, {recorded!r} recorded"]


def assert_same_numbers(measured, recorded, what: str, *, rel: float = FLOAT64_STATISTIC,
                        floor: float = FLOAT64_FLOOR) -> None:
    """Fail, naming every place and ``what`` to do, where :func:`differences` finds any."""
    found = differences(measured, recorded, rel=rel, floor=floor)
    assert not found, f"{what} (beyond round-off, rel {rel:g}):\n  " + "\n  ".join(found[:20])


# Predicted classes from a float32 network. Where the log-ratio of an example's top two probabilities is below this,
# its class may come out otherwise on another CPU: logits of about 10 agree to about 1e-5 relative across instruction
# sets (1e-4 apart at most), so the ratio moves by under 2e-4; 1e-3 leaves five times that (for two classes: a
# tumour probability within 2.5e-4 of 1/2). Every other example's class is decided on every CPU and must be equal.
TIE_LOG_RATIO = 1e-3
# A record that keeps only a digest of the classes is matched by trying every way of turning its near ties to their
# second class, up to this many of them (4,096 digests); a part of 2,000 examples has had none so far.
MOST_TIES = 12


def near_ties(probabilities: np.ndarray) -> np.ndarray:
    """Indices of the rows of ``probabilities`` ``(N, classes)`` whose two largest are within :data:`TIE_LOG_RATIO`
    in log."""
    top_two = np.sort(np.asarray(probabilities, dtype=np.float64), axis=1)[:, -2:]
    with np.errstate(divide="ignore"):
        return np.flatnonzero(np.log(top_two[:, 1]) - np.log(top_two[:, 0]) < TIE_LOG_RATIO)


def classes_of_digest(probabilities: np.ndarray, digest: str, digest_of: Callable[[np.ndarray], str]) -> \
        np.ndarray | None:
    """The classes (uint8) whose ``digest_of`` is ``digest``, among the argmax of ``probabilities`` and its variants
    with near ties (:func:`near_ties`) turned to their second class; None where none is."""
    classes = probabilities.argmax(axis=1).astype(np.uint8)
    ties = near_ties(probabilities)
    assert len(ties) <= MOST_TIES, f"{len(ties)} near-tied examples in one part: more than MOST_TIES"
    second = np.argsort(probabilities, axis=1)[:, -2].astype(np.uint8)
    for flipped in range(2 ** len(ties)):
        chosen = ties[[bool(flipped >> bit & 1) for bit in range(len(ties))]]
        candidate = classes.copy()
        candidate[chosen] = second[chosen]
        if digest_of(candidate) == digest:
            return candidate
    return None


def _is_list(value) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _close(a: float, b: float, rel: float, floor: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or abs(a - b) <= max(rel * max(abs(a), abs(b)), floor)
