"""Table 3 over seeds: per-seed metrics and their spread, and the claims tested by a paired bootstrap over the
patches that every seed shares (experiments/table3_over_seeds.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from experiments import table3_over_seeds
from experiments.patch_records import encode

LABELS = np.array([0, 1] * 300)


def scores(right: float, rng: np.random.Generator) -> np.ndarray:
    """Tumour probabilities right on about ``right`` of the patches."""
    correct = rng.random(len(LABELS)) < right
    confident = 0.5 + 0.4 * rng.random(len(LABELS))
    return np.where(correct == (LABELS == 1), confident, 1 - confident).astype(np.float32)


def test_a_model_better_on_every_seed_holds_and_the_seeds_agree():
    rng = np.random.default_rng(0)
    records = {"good": {s: scores(0.9, rng) for s in (0, 1, 2)}, "bad": {s: scores(0.8, rng) for s in (0, 1, 2)}}
    claim = table3_over_seeds.seed_claim("good", "bad", "good beats bad", records, LABELS, resamples=500)
    assert claim.seeds == (0, 1, 2) and all(d > 0 for d in claim.differences) and claim.seeds_agree
    assert claim.p < 0.01 and claim.verdict == "holds" and claim.low > 0
    assert all(p < 0.05 for p in claim.mcnemar_p)
    reversed_claim = table3_over_seeds.seed_claim("bad", "good", "bad beats good", records, LABELS, resamples=500)
    assert reversed_claim.verdict == "reversed" and reversed_claim.p == pytest.approx(1 - claim.p)


def test_seeds_that_disagree_are_said_to():
    rng = np.random.default_rng(1)
    records = {"a": {0: scores(0.9, rng), 1: scores(0.7, rng)}, "b": {0: scores(0.7, rng), 1: scores(0.9, rng)}}
    claim = table3_over_seeds.seed_claim("a", "b", "a beats b", records, LABELS, resamples=500)
    assert not claim.seeds_agree and claim.verdict.endswith(", but the seeds disagree")
    assert claim.differences[0] > 0 > claim.differences[1]


def test_the_bootstrap_draws_one_set_of_patches_for_every_seed():
    """Two seeds of identical predictions weigh as one: the interval is that of a single seed, not narrower."""
    rng = np.random.default_rng(2)
    a, b = scores(0.88, rng), scores(0.85, rng)
    one = table3_over_seeds.seed_claim("a", "b", "", {"a": {0: a}, "b": {0: b}}, LABELS, resamples=800)
    twice = table3_over_seeds.seed_claim("a", "b", "", {"a": {0: a, 1: a}, "b": {0: b, 1: b}}, LABELS, resamples=800)
    assert (twice.low, twice.high, twice.p) == pytest.approx((one.low, one.high, one.p))


def test_records_and_rows_from_folders(tmp_path):
    rng = np.random.default_rng(3)
    folders = {0: tmp_path / "seed0", 1: tmp_path / "seeds", 2: tmp_path / "seeds"}
    for seed, folder in folders.items():
        (folder / "test_predictions").mkdir(parents=True, exist_ok=True)
        record = {"data": {"files_labels_sha256": "listing"}, "tumour_probability": encode(scores(0.85, rng))}
        (folder / "test_predictions" / f"p4_densenet-seed{seed}.json").write_text(json.dumps(record))
    records = table3_over_seeds.seed_records(("p4_densenet", "densenet"), "listing", folders)
    assert set(records) == {"p4_densenet"} and set(records["p4_densenet"]) == {0, 1, 2}
    rows = table3_over_seeds.model_rows(records, LABELS)
    mean, sd = rows["p4_densenet"]["summary"]["accuracy"]
    accuracies = [rows["p4_densenet"]["seeds"][s]["accuracy"] for s in (0, 1, 2)]
    assert mean == pytest.approx(np.mean(accuracies)) and sd == pytest.approx(np.std(accuracies, ddof=1))
    text = table3_over_seeds.seeds_markdown(("p4_densenet", "densenet"), rows,
                                            [("p4_densenet", "densenet", "p4 beats Z2")], records, LABELS)
    assert "| densenet | - | - | - |" in text and "waiting for both models' records" in text
    with pytest.raises(ValueError, match="other test patches"):
        table3_over_seeds.seed_records(("p4_densenet",), "another listing", folders)


def test_readme_and_pathology_doc_hold_the_blocks_the_command_writes():
    """`python -m experiments table3 --seeds --write` wrote them from the committed records and cards."""
    from experiments.patch_records import listing_sha256, read_test_labels
    from experiments.table3 import CLAIMS, MODELS, RELEASE
    from tests.conftest import require_shared

    data = table3_over_seeds.REPO / "../shared/data/pcam_public"
    require_shared(data / "labels.csv", f"{data / 'labels.csv'} not found (pcam_public lives in ../shared/data)")
    names, labels = read_test_labels(data)
    claims = [claim for claim in CLAIMS if RELEASE not in claim[:2]]
    blocks = table3_over_seeds.seed_blocks(MODELS, claims, labels, listing_sha256(names, labels))
    for name, (begin, end, documents) in table3_over_seeds.MARKERS.items():
        for document in documents:
            text = (table3_over_seeds.REPO / document).read_text()
            assert text.count(begin) == 1 and text.count(end) == 1, f"{document}: one {name} block between markers"
            kept = text.split(begin + "\n", 1)[1].split(end, 1)[0]
            assert kept == blocks[name] + "\n", \
                f"{document}'s {name} block: python -m experiments table3 --seeds --write"
