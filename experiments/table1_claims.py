"""The paper's Table 1 claims, tested on our seeds: each attentive model against the P4CNN of its size, and
full attention against the other attentions.

    python -m experiments report results/rot_mnist --claims

Each claim says that model A makes fewer test errors than model B. The test is an exact one-sided permutation
test on the difference of their mean test errors over seeds: of every way to split the pooled seeds' errors
into groups of A's and B's sizes, the fraction whose difference is at most the observed one. It assumes nothing
about how errors spread over seeds; with three seeds each its smallest p is 1/20 = 0.05, reached only when
every seed of A beats every seed of B.
"""

from __future__ import annotations

import itertools
import math
import statistics
from pathlib import Path

from .results_tables import cards_by_seed, mean_std

__all__ = ["CLAIMS", "LEVEL", "permutation_p", "claim_verdict", "claims_table"]

# (A, B, why): "A makes fewer errors than B". Sizes from the README's architecture table: arh_p4cnn 24,851 and
# p4cnn 24,610 parameters; fa_p4cnn 29,462 and big11 29,051; ach/asp 48,630 / 49,110 and big15 50,415;
# a_p4cnn 73,130 and big19 77,539.
CLAIMS: list[tuple[str, str, str]] = [
    ("arh_p4cnn", "p4cnn", "rotation attention beats P4CNN of its size"),
    ("fa_p4cnn", "big11_p4cnn", "alpha_F beats P4CNN of its size"),
    ("ach_p4cnn", "big15_p4cnn", "channel attention beats P4CNN of its size"),
    ("asp_p4cnn", "big15_p4cnn", "spatial attention beats P4CNN of its size"),
    ("a_p4cnn", "big19_p4cnn", "full attention beats P4CNN of its size"),
] + [("a_p4cnn", other, "full attention beats every other attention")
     for other in ("arh_p4cnn", "fa_p4cnn", "ach_p4cnn", "asp_p4cnn")]

LEVEL = 0.05  # one-sided significance at which a claim is said to hold (or to be reversed)


def permutation_p(a: list[float], b: list[float]) -> float:
    """Exact one-sided p of "mean(a) < mean(b)": the fraction of splits of a + b into len(a) and len(b) values
    whose mean difference is at most the observed one (the observed split included)."""
    pooled, total = a + b, sum(a) + sum(b)
    observed = statistics.fmean(a) - statistics.fmean(b)
    differences = []
    for chosen in itertools.combinations(range(len(pooled)), len(a)):
        picked = sum(pooled[i] for i in chosen)
        differences.append(picked / len(a) - (total - picked) / len(b))
    # A relative tolerance, so that a split equal to the observed one up to round-off counts as at most it.
    slack = 1e-12 * max(1.0, abs(observed))
    return sum(d <= observed + slack for d in differences) / len(differences)


def claim_verdict(a: list[float], b: list[float]) -> tuple[float | None, str]:
    """(one-sided p of "a below b" or None, verdict) for test errors over seeds."""
    if not a or not b or math.comb(len(a) + len(b), len(a)) * LEVEL < 1:
        # Too few seeds for any split to be that rare: 3 + 3 is the least that can decide at 0.05.
        return None, "not yet: needs 3 seeds of each"
    p_holds, p_reversed = permutation_p(a, b), permutation_p(b, a)
    if p_holds <= LEVEL:
        return p_holds, "holds"
    if p_reversed <= LEVEL:
        return p_holds, "reversed"
    leaning = "ahead" if statistics.fmean(a) < statistics.fmean(b) else "behind"
    return p_holds, f"not resolved ({leaning}, within the seeds' spread)"


def _summary(values: list[float]) -> str:
    return mean_std(values) if values else "no runs"


def claims_table(folder: str | Path) -> str:
    """A markdown table: each claim with both models' test error % (mean +- std over seeds), seeds, p, verdict."""
    cards = cards_by_seed(folder)

    def errors(arch: str) -> list[float]:
        return [card["metrics"]["test_error"] for _, card in sorted(cards.get(arch, {}).items())]

    rows = [
        "| claim: A makes fewer errors than B | A | B | A's test error % | B's test error % | seeds (A + B) "
        "| p (A below B, one-sided) | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for a, b, why in CLAIMS:
        ours_a, ours_b = errors(a), errors(b)
        p, verdict = claim_verdict(ours_a, ours_b)
        rows.append(f"| {why} | {a} | {b} | {_summary(ours_a)} | {_summary(ours_b)} | {len(ours_a)} + {len(ours_b)} "
                    f"| {'-' if p is None else f'{p:.2f}'} | {verdict} |")
    return "\n".join(rows)
