"""Table 3 over seeds: every model's test metrics per seed, their mean and spread, and each of the paper's claims
tested over the seeds at hand.

    python -m experiments table3 --seeds          # seed 0 from results/pcam_table3, seeds 1 and 2 from *_seeds

The per-patch records are those of ``python -m experiments table3 ... --record`` (seed 0) and ``... --record --sweep
table3_seeds`` (seeds 1 and 2): each model's tumour probability on the same 1,944 test patches.

A claim "A beats B" over seeds is tested on the mean over seeds of A's accuracy minus B's, by a paired stratified
bootstrap over the **patches**: one draw of patches (with replacement, within each class) serves every seed and
both models, because the seeds' networks are all judged on the same patches and their errors are correlated
through them; pooling the McNemar counts of the seeds instead would count a hard patch once per seed, as if it
were three independent patches, and make the test anti-conservative. The seeds themselves are not resampled (three
cannot be): the p says how surely these trained networks differ on patches like these, and the per-seed
differences beside it say whether the seeds agree. Each seed's own exact McNemar p is listed too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from training.bootstrap import RESAMPLES, percentile_interval, stratified_draws
from training.bootstrap import SEED as BOOTSTRAP_SEED

from .fig5_over_seeds import nuclei_entries, nuclei_markdown
from .generated_blocks import rewrite_block
from .paired_tests import mcnemar, verdict
from .patch_records import card_metrics, read_record

__all__ = ["SeedClaim", "seed_records", "model_rows", "seed_claim", "seeds_markdown", "seed_blocks", "write_blocks",
           "FOLDERS", "RESAMPLES", "MARKERS"]

REPO = Path(__file__).resolve().parents[1]
# Each block's markers and the documents that hold it (the nuclei tables are reference material: docs only). The
# markers name the command in the form the documents have always named (python -m training hands it to experiments.cli).
MARKERS = {
    "seeds": ("<!-- table3 seeds: begin (python -m training table3 --seeds --write rewrites what follows) -->",
              "<!-- table3 seeds: end -->", ("README.md", "docs/pathology.md")),
    "nuclei": ("<!-- nuclei seeds: begin (python -m training table3 --seeds --write rewrites what follows) -->",
               "<!-- nuclei seeds: end -->", ("docs/pathology.md",)),
}
# Where each seed's records are: the sweep table3 (seed 0) and table3_seeds (seeds 1 and 2).
FOLDERS = {0: Path("results/pcam_table3"), 1: Path("results/pcam_table3_seeds"), 2: Path("results/pcam_table3_seeds")}


def seed_records(models: tuple[str, ...], listing: str, folders: dict[int, Path] = FOLDERS) -> dict:
    """``{model: {seed: tumour probabilities}}`` of every record found; records of other patches are refused.

    Args:
        listing: the test split's ``files_labels_sha256`` (:func:`experiments.patch_records.listing_sha256`).
    """
    found: dict[str, dict[int, np.ndarray]] = {}
    for model in models:
        for seed, folder in folders.items():
            path = folder / "test_predictions" / f"{model}-seed{seed}.json"
            if not path.is_file():
                continue
            record, tumour = read_record(path)
            if record["data"]["files_labels_sha256"] != listing:
                raise ValueError(f"{path} measured other test patches than labels.csv lists")
            found.setdefault(model, {})[seed] = tumour
    return found


def model_rows(records: dict, labels: np.ndarray) -> dict[str, dict]:
    """Per model: each seed's accuracy, AUC, NLL and ECE, and their mean and sample sd over the seeds."""
    rows = {}
    for model, by_seed in records.items():
        per_seed = {}
        for seed, tumour in sorted(by_seed.items()):
            metrics = card_metrics(tumour, labels)
            per_seed[seed] = {"accuracy": 1 - metrics["error"], "auc": metrics["auc"], "nll": metrics["nll"],
                              "ece": metrics["ece"]}
        summary = {}
        for name in ("accuracy", "auc", "nll", "ece"):
            values = np.array([m[name] for m in per_seed.values()])
            summary[name] = (float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else None)
        rows[model] = {"seeds": per_seed, "summary": summary}
    return rows


@dataclass(frozen=True)
class SeedClaim:
    """"A beats B" over the seeds both have.

    Attributes:
        seeds: the seeds tested.
        differences: A's accuracy minus B's, per seed.
        mcnemar_p: each seed's exact one-sided McNemar p.
        mean_difference: their mean.
        low, high: the bootstrap's 95 % percentile interval of the mean difference.
        p, p_reversed: one-sided bootstrap p of "A beats B" and of "B beats A".
    """

    a: str
    b: str
    why: str
    seeds: tuple[int, ...]
    differences: tuple[float, ...]
    mcnemar_p: tuple[float, ...]
    mean_difference: float
    low: float
    high: float
    p: float
    p_reversed: float

    @property
    def seeds_agree(self) -> bool:
        return all(d > 0 for d in self.differences) or all(d < 0 for d in self.differences)

    @property
    def verdict(self) -> str:
        """The bootstrap's verdict; where the seeds point different ways it speaks for these networks, not for the
        architecture, and says so."""
        said = verdict(self.p, self.p_reversed, self.mean_difference)
        return said if self.seeds_agree or len(self.seeds) < 2 else f"{said}, but the seeds disagree"


def seed_claim(a: str, b: str, why: str, records: dict, labels: np.ndarray, resamples: int = RESAMPLES,
               seed: int = BOOTSTRAP_SEED) -> SeedClaim | None:
    """The test of the module docstring on the seeds both models have; None where they share none."""
    seeds = tuple(sorted(set(records.get(a, {})) & set(records.get(b, {}))))
    if not seeds:
        return None
    correct_a = np.stack([(records[a][s] > 0.5) == labels for s in seeds])  # (S, N)
    correct_b = np.stack([(records[b][s] > 0.5) == labels for s in seeds])
    differences = correct_a.mean(axis=1) - correct_b.mean(axis=1)  # (S,)
    draws = stratified_draws(labels, resamples, seed)  # (R, N), one draw for every seed and both models
    # Per resample, the mean over seeds of the accuracy difference on the drawn patches: (R,).
    step = correct_a.astype(np.int8) - correct_b.astype(np.int8)  # (S, N): +1 only A right, -1 only B right
    resampled = step.mean(axis=0)[draws].mean(axis=1)
    below, tied = int((resampled < 0).sum()), int((resampled == 0).sum())
    low, high = percentile_interval(resampled)
    return SeedClaim(a, b, why, seeds, tuple(float(d) for d in differences),
                     tuple(mcnemar(correct_a[i], correct_b[i]).p for i in range(len(seeds))),
                     float(differences.mean()), low, high,
                     (below + tied / 2) / resamples, (resamples - below - tied / 2) / resamples)


def _spread(mean: float, sd: float | None, scale: float = 1.0, places: int = 3) -> str:
    """``mean +- sd`` (sample sd over seeds; the mean alone for one seed)."""
    return f"{scale * mean:.{places}f}" + ("" if sd is None else f" +- {scale * sd:.{places}f}")


def _p(p: float, resamples: int = RESAMPLES) -> str:
    if p == 0:
        return f"< {1 / resamples:.4f}"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def seeds_markdown(models: tuple[str, ...], rows: dict, claims: list[tuple[str, str, str]], records: dict,
                   labels: np.ndarray) -> str:
    """The table per model and seed, and the claims over seeds, as markdown."""
    seeds = sorted({s for by_seed in records.values() for s in by_seed})
    head = "| model | " + " | ".join(f"seed {s}: accuracy % (AUC)" for s in seeds) + \
           " | accuracy % mean +- sd | AUC | NLL | ECE |"
    lines = [head, "|" + "---|" * (len(seeds) + 5)]
    for model in models:
        if model not in rows:
            lines.append(f"| {model} | " + " | ".join("-" for _ in seeds) + " | - | - | - | - |")
            continue
        row = rows[model]
        cells = [f"{100 * row['seeds'][s]['accuracy']:.1f} ({row['seeds'][s]['auc']:.3f})" if s in row["seeds"]
                 else "-" for s in seeds]
        summary = row["summary"]
        spreads = [_spread(*summary["accuracy"], 100, 1)] + [_spread(*summary[name]) for name in ("auc", "nll", "ece")]
        lines.append(f"| {model} | " + " | ".join(cells + spreads) + " |")
    lines += ["", "| the paper's claim: A beats B | A | B | seeds | A - B per seed (points) | McNemar p per seed "
              "| mean A - B [95 %] | bootstrap p | verdict | seeds agree |", "|" + "---|" * 10]
    for a, b, why in claims:
        claim = seed_claim(a, b, why, records, labels)
        if claim is None:
            lines.append(f"| {why} | {a} | {b} | waiting for both models' records | - | - | - | - | - | - |")
            continue
        per_seed = ", ".join(f"{100 * d:+.1f}" for d in claim.differences)
        mcnemar_p = ", ".join(_p(p) for p in claim.mcnemar_p)
        lines.append(f"| {why} | {a} | {b} | {', '.join(map(str, claim.seeds))} | {per_seed} | {mcnemar_p} "
                     f"| {100 * claim.mean_difference:+.1f} [{100 * claim.low:+.1f}, {100 * claim.high:+.1f}] "
                     f"| {_p(claim.p)} | {claim.verdict} | {'yes' if claim.seeds_agree else 'no'} |")
    return "\n".join(lines)


def seed_blocks(models: tuple[str, ...], claims: list[tuple[str, str, str]], labels: np.ndarray,
                listing: str) -> dict[str, str]:
    """The two blocks of :data:`MARKERS`: the table and the claims over seeds; attention on nuclei over seeds."""
    records = seed_records(models, listing)
    seeds = sorted({s for by_seed in records.values() for s in by_seed})
    intro = (f"Seeds {', '.join(map(str, seeds))} of the same recipe (preset `pcam_table3`; seed 0 in "
             "`results/pcam_table3`, seeds 1 and 2 in `results/pcam_table3_seeds`), each run's predictions on the "
             "1,944 test patches of pcam_public. Mean +- sample sd over the seeds. A claim over seeds is tested on "
             "the mean over seeds of A's accuracy minus B's: a paired stratified bootstrap over the patches "
             f"({RESAMPLES:,} resamples), one draw serving every seed; each seed's exact McNemar p beside it.")
    return {"seeds": intro + "\n\n" + seeds_markdown(models, model_rows(records, labels), claims, records, labels),
            "nuclei": nuclei_markdown(nuclei_entries(FOLDERS))}


def write_blocks(blocks: dict[str, str], log) -> None:
    """Rewrite each block between its markers in its documents."""
    for name, text in blocks.items():
        begin, end, documents = MARKERS[name]
        for document in documents:
            changed = rewrite_block(REPO / document, begin, end, text)
            log(f"{document}: {name} block {'rewritten' if changed else 'already up to date'}")
