"""The paper's Table 3 (PCam) as a controlled experiment: the sweep ``table3``'s five DenseNets and the paper's
release on the same 1,944 test patches, each of the paper's claims a paired test on those patches.

    python -m experiments table3 results/pcam_table3                     # the table and the claims, from what exists
    python -m experiments table3 results/pcam_table3 --runs-dir ../runs  # unfinished runs say how far they got
    python -m experiments table3 results/pcam_table3 --record --runs-dir ../runs   # record finished runs' predictions
    python -m experiments table3 results/pcam_table3_seeds --record --runs-dir ../runs --sweep table3_seeds
    python -m experiments table3 --seeds                                 # every seed recorded: table3_over_seeds.py
    python -m experiments table3 results/pcam_table3 --write             # and rewrite README.md, docs/pathology.md
    python -m experiments table3 results/pcam_table3 --release --write   # measure the release again, keep its summary
    python -m experiments table3 --stand-in p4m_densenet=results/pcam_test_predictions/p4m_densenet_pcam.json

A row is a model's test accuracy (Wilson interval), AUC, NLL and ECE (stratified bootstrap intervals,
:func:`training.metrics.confidence_intervals`), from its per-patch record in ``FOLDER/test_predictions/`` (ours:
:mod:`experiments.patch_records`, bound to the run's card and checkpoint by sha256) or, for the release, measured
here (:mod:`experiments.paper_release`), beside the paper's figure where this project quotes it. A claim "A beats B"
is the exact one-sided McNemar test on the patches each gets right and the paired bootstrap of the AUC difference
(:mod:`experiments.paired_tests`), one verdict each. A claim whose model is missing waits for it. ``--stand-in``
puts another record in a model's place to exercise the machinery; stand-ins are never written anywhere.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from models import load_checkpoint
from training.atomic import write_atomic
from training.data import DataError, load_dataset
from training.presets import recipe
from training.provenance import sha256_file
from training.run_files import BEST
from training.sweep import SWEEPS, run_folder, run_status

from . import table3_over_seeds
from .card_records import as_trained
from .generated_blocks import rewrite_block
from .paired_tests import mcnemar, paired_auc_bootstrap, verdict
from .paper_release import in_test_order, load_release, measure_parts, release_path, release_summary
from .patch_records import (
    data_identity,
    listing_sha256,
    prediction_record,
    read_record,
    read_test_labels,
    tumour_intervals,
    write_record,
)
from .results_tables import PAPER_TEST_ERROR

__all__ = ["MODELS", "RELEASE", "CLAIMS", "BEGIN", "END", "Model", "ours", "release", "claims", "table_markdown",
           "claims_markdown", "block", "record_runs", "add_arguments", "run"]

# The paper's Table 3 order.
MODELS = ("densenet", "p4_densenet", "p4m_densenet", "fa_p4_densenet", "fa_p4m_densenet")
RELEASE = "release"
SEED = 0
REPO = Path(__file__).resolve().parents[1]
SWEEP = SWEEPS["table3"]
# The paper's test error (%) on PCam's whole test set, where this project quotes it (experiments.results_tables): its
# figures for P4-DenseNet and alpha_F-P4-DenseNet are not quoted here, and are left out rather than guessed.
PAPER_ERROR = {name: PAPER_TEST_ERROR.get(("pcam", name)) for name in MODELS}
# (A, B, the paper's claim that A beats B); the release (trained on all of PCam) against ours last.
CLAIMS: tuple[tuple[str, str, str], ...] = (
    ("p4_densenet", "densenet", "p4 beats Z2"),
    ("p4m_densenet", "p4_densenet", "p4m beats p4"),
    ("fa_p4_densenet", "p4_densenet", "alpha_F-p4 beats p4"),
    ("fa_p4m_densenet", "p4m_densenet", "alpha_F-p4m beats p4m"),
    ("fa_p4_densenet", "p4m_densenet", "alpha_F-p4 already outperforms p4m"),
    (RELEASE, "p4m_densenet", "the paper's release beats our p4m_densenet"),
)
RESAMPLES, BOOTSTRAP_SEED = 2000, 0
PREDICTIONS = "test_predictions"
RELEASE_FILE = "release/p4m_densenet.json"
# The markers name the command in the form the documents have always named (python -m training hands it over).
BEGIN = "<!-- table3: begin (python -m training table3 results/pcam_table3 --write rewrites what follows) -->"
END = "<!-- table3: end -->"
DOCUMENTS = ("docs/pathology.md",)  # seed 0 with the release; the README holds the table over seeds
_KEPT_CLAIM = ("accuracy", "mcnemar", "auc", "b_tumour_sha256")  # what the release's summary keeps of its claim
_REFERENCE_NEEDED = "../shared/reference (the release's predictions are measured there, never kept)"


@dataclass(frozen=True)
class Model:
    """One row: a model's numbers on the test patches, or why it has none yet.

    Attributes:
        name: an architecture of :data:`MODELS`, or :data:`RELEASE`.
        status: what the row says in place of numbers ("" when it has them).
        source: where the numbers come from (a record, a card, a stand-in).
        tumour: tumour probability of every test patch, test-split order (None: not at hand).
        intervals: :func:`training.metrics.confidence_intervals` of the test patches.
        stand_in: the numbers are another model's, put in its place by ``--stand-in``.
    """

    name: str
    status: str = ""
    source: str = ""
    tumour: np.ndarray | None = None
    intervals: dict | None = None
    stand_in: bool = False
    waits_for: str = ""

    @property
    def waiting(self) -> str:
        """What a claim on this model waits for, where its per-patch predictions are not at hand."""
        return self.waits_for or self.name


def tumour_sha256(tumour: np.ndarray) -> str:
    """What binds a stored claim to the predictions it was computed from: sha256 of the float32 bytes."""
    return hashlib.sha256(np.ascontiguousarray(tumour, dtype=np.float32).tobytes()).hexdigest()


def _recorded(name: str, path: Path, labels: np.ndarray, listing: str, source: str, stand_in=False) -> Model:
    record, tumour = read_record(path)
    if record["data"]["files_labels_sha256"] != listing or len(tumour) != len(labels):
        raise ValueError(f"{path} measured other test patches than labels.csv lists")
    return Model(name, source=source, tumour=tumour, intervals=tumour_intervals(tumour, labels), stand_in=stand_in)


def _not_done(name: str, runs_dir: Path | None) -> str:
    if runs_dir is None:
        return "not trained yet"
    status = run_status(runs_dir, SWEEP, name, SEED)
    if status.finished:
        return "finished; its card is not in the results folder yet"
    return f"in progress: epoch {status.epochs_done} of {status.epochs}" if status.started else "not trained yet"


def ours(folder: Path, labels: np.ndarray, listing: str, runs_dir: Path | None = None,
         stand_ins: dict[str, Path] | None = None) -> dict[str, Model]:
    """Each of :data:`MODELS`: from its record, a stand-in's record, its card alone, or the state of its run."""
    stand_ins = stand_ins or {}
    models = {}
    for name in MODELS:
        card, record = folder / f"{name}-seed{SEED}.json", folder / PREDICTIONS / f"{name}-seed{SEED}.json"
        if name in stand_ins:
            path = stand_ins[name]
            models[name] = _recorded(name, path, labels, listing, f"stand-in: `{path.name}`", stand_in=True)
        elif record.is_file():
            bound = card.is_file() and json.loads(record.read_text()).get("card_sha256") == sha256_file(card)
            if not bound:
                raise ValueError(f"{record} is not of the card {card}: record it again with --record")
            models[name] = _recorded(name, record, labels, listing, f"`{card.stem}`")
        elif card.is_file():
            intervals = json.loads(card.read_text())["metrics"].get("test_intervals")
            models[name] = Model(name, source=f"`{card.stem}` (card only; predictions not recorded: --record)",
                                 intervals=intervals, waits_for=f"{name}'s predictions (--record)")
        else:
            models[name] = Model(name, status=_not_done(name, runs_dir))
    return models


def release(folder: Path, labels: np.ndarray, listing: str, load_test, *, measure: bool) -> tuple[Model, dict | None]:
    """The release's row and its summary: measured now when ``measure`` (and the reference is here), else the
    stored summary's figures (no per-patch predictions); None when there is neither.

    Args:
        load_test: returns the test split (decoding the patches takes a while: only called to measure).
    """
    stored_file = folder / RELEASE_FILE
    stored = json.loads(stored_file.read_text()) if stored_file.is_file() else None
    if measure and release_path().is_file():
        test = load_test()
        started = time.perf_counter()
        by_part = measure_parts(load_release(), test)
        identity = {"patches": len(labels), "files_labels_sha256": listing}
        summary = release_summary(by_part, labels, identity, time.perf_counter() - started)
        return Model(RELEASE, source=f"summary: `{RELEASE_FILE}`", tumour=in_test_order(by_part),
                     intervals=summary["intervals"]), summary
    if stored is not None:
        if stored["data"]["files_labels_sha256"] != listing:
            raise ValueError(f"{stored_file} measured other test patches than labels.csv lists")
        return Model(RELEASE, source=f"summary: `{RELEASE_FILE}`", intervals=stored["intervals"],
                     waits_for=_REFERENCE_NEEDED), stored
    return Model(RELEASE, status="not measured: needs ../shared/reference", waits_for=_REFERENCE_NEEDED), None


def _claim(a: Model, b: Model, why: str, labels: np.ndarray, stored: dict | None) -> dict:
    """One claim's tests, or what it waits for. ``stored``: the release's summary, whose kept claim stands in for
    the release's predictions when they are not at hand, if it was computed from these very predictions of B."""
    claim = {"a": a.name, "b": b.name, "why": why}
    kept = (stored or {}).get("claim")
    if a.name == RELEASE and a.tumour is None and b.tumour is not None and kept \
            and kept["b_tumour_sha256"] == tumour_sha256(b.tumour):
        return {**claim, **{key: kept[key] for key in _KEPT_CLAIM}}
    missing = [m for m in (a, b) if m.tumour is None]
    if a.name == RELEASE and b.tumour is None and release_path().is_file():
        missing = [b]  # the release is measured as soon as B's predictions are there
    if missing:
        return {**claim, "waiting": "waiting for " + " and ".join(m.waiting for m in missing)}
    right_a, right_b = (a.tumour > 0.5) == labels, (b.tumour > 0.5) == labels
    auc = paired_auc_bootstrap(a.tumour, b.tumour, labels, resamples=RESAMPLES, seed=BOOTSTRAP_SEED)
    return {**claim, "accuracy": [float(right_a.mean()), float(right_b.mean())],
            "mcnemar": mcnemar(right_a, right_b).as_dict(), "auc": auc.as_dict(),
            "b_tumour_sha256": tumour_sha256(b.tumour)}


def claims(models: dict[str, Model], labels: np.ndarray, stored: dict | None = None) -> list[dict]:
    """Every claim of :data:`CLAIMS` on the models at hand, with a verdict on accuracy and one on AUC, or what it
    waits for.

    Args:
        models: :func:`ours` with the :func:`release` row as ``models[RELEASE]``.
        stored: the release's kept summary (:func:`release`), if any.
    """
    out = []
    for a, b, why in CLAIMS:
        claim = _claim(models[a], models[b], why, labels, stored)
        if "mcnemar" in claim:
            test, auc = claim["mcnemar"], claim["auc"]
            claim["accuracy_verdict"] = verdict(test["p"], test["p_reversed"],
                                                test["only_a_right"] - test["only_b_right"])
            claim["auc_verdict"] = verdict(auc["p"], auc["p_reversed"], auc["difference"])
        out.append(claim)
    return out


def _interval(entry: dict, percent: bool = False) -> str:
    """``value [low, high]``: percentages with one decimal, other metrics with three."""
    scale, places = (100, 1) if percent else (1, 3)
    value, low, high = (scale * entry[key] for key in ("value", "low", "high"))
    return f"{value:.{places}f} [{low:.{places}f}, {high:.{places}f}]"


def _p(p: float, resamples: int | None = None) -> str:
    """A p-value as text; a bootstrap's 0 is "< 1 / resamples" (no resample went the other way)."""
    if resamples and p == 0:
        return f"< {1 / resamples:.4f}"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def _label(name: str) -> str:
    return "the paper's release (P4M-DenseNet, trained on all of PCam)" if name == RELEASE else name


def table_markdown(models: dict[str, Model]) -> str:
    """One row per model of :data:`MODELS`, then the release: its numbers with 95 % intervals, or its state."""
    rows = [
        "| model | card | test accuracy % | AUC | NLL | ECE | paper's test accuracy % (error %) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in (*MODELS, RELEASE):
        model = models[name]
        paper = PAPER_ERROR.get(name)
        paper_cell = "-" if paper is None else f"{100 - paper:.2f} ({paper:.2f})"
        if model.intervals is None:
            rows.append(f"| {_label(name)} | - | {model.status} | - | - | - | {paper_cell} |")
            continue
        cells = [_interval(model.intervals["accuracy"], percent=True)]
        cells += [_interval(model.intervals[key]) for key in ("auc", "nll", "ece")]
        rows.append(f"| {_label(name)} | {model.source or '-'} | {' | '.join(cells)} | {paper_cell} |")
    return "\n".join(rows)


def claims_markdown(claim_list: list[dict]) -> str:
    """One row per claim: McNemar's counts, p and verdict; the AUC difference, its p and verdict."""
    rows = [
        "| the paper's claim: A beats B | A | B | accuracy % A / B | only A right / only B right | McNemar p "
        "| on accuracy | AUC A - B [95 %] | bootstrap p | on AUC |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for claim in claim_list:
        head = f"| {claim['why']} | {'the release' if claim['a'] == RELEASE else claim['a']} | {claim['b']} "
        if "waiting" in claim:
            rows.append(head + f"| {claim['waiting']} | - | - | - | - | - | - |")
            continue
        test, auc = claim["mcnemar"], claim["auc"]
        accuracy = " / ".join(f"{100 * value:.1f}" for value in claim["accuracy"])
        rows.append(head + f"| {accuracy} | {test['only_a_right']} / {test['only_b_right']} | {_p(test['p'])} "
                    f"| {claim['accuracy_verdict']} | {auc['difference']:+.3f} [{auc['low']:+.3f}, {auc['high']:+.3f}] "
                    f"| {_p(auc['p'], auc['resamples'])} | {claim['auc_verdict']} |")
    return "\n".join(rows)


def block(models: dict[str, Model], claim_list: list[dict], folder: str = "results/pcam_table3") -> str:
    """The table, the claims and how to read them: what the README and docs/pathology.md hold between markers."""
    stand_ins = [name for name, model in models.items() if model.stand_in]
    warning = (f"**Stand-ins, not Table 3:** {', '.join(stand_ins)} are other models' predictions put in their "
               "place to exercise the tests.\n\n" if stand_ins else "")
    return (
        f"{warning}The sweep `table3` ({len(MODELS)} models, seed {SEED}, preset `pcam_table3`), its cards in "
        f"`{folder}`, on the 1,944 test patches of pcam_public; the paper's released PCam model measured on the same "
        "patches (only its summary is kept). 95 % intervals: accuracy Wilson, AUC, NLL and ECE stratified "
        "bootstrap of 2,000 resamples. The paper's figures are on PCam's whole test set (32,768 patches); its "
        "P4-DenseNet and alpha_F-P4-DenseNet figures are not quoted in this project.\n\n"
        f"{table_markdown(models)}\n\n"
        "Each of the paper's claims as paired tests on these patches, one-sided in the paper's direction: the exact "
        "McNemar test on the patches only one of the two gets right (the binomial tail, not the mid-p), and a "
        f"paired stratified bootstrap of the AUC difference ({RESAMPLES:,} resamples, seed {BOOTSTRAP_SEED}). A "
        "claim holds at p < 0.05, is reversed when the other direction's p is below 0.05, and is otherwise not "
        "resolved.\n\n"
        f"{claims_markdown(claim_list)}\n"
    )


def record_runs(folder: Path, runs_dir: Path, load_test, log=print, sweep: str = "table3") -> list[Path]:
    """Record each finished run of ``sweep`` (``table3``, or ``table3_seeds``: seeds 1 and 2), its card in
    ``folder`` and its checkpoint in its run folder, where the record is missing or of another card or checkpoint;
    returns the records written."""
    written = []
    for name, seed in SWEEPS[sweep].order():
        card = folder / f"{name}-seed{seed}.json"
        if not card.is_file():
            continue
        best = run_folder(runs_dir, SWEEPS[sweep], name, seed) / BEST
        out = folder / PREDICTIONS / card.name
        if out.is_file():
            kept = json.loads(out.read_text())
            same_checkpoint = not best.is_file() or kept["sha256"] == sha256_file(best)
            if kept.get("card_sha256") == sha256_file(card) and same_checkpoint:
                log(f"{name}: {out} is up to date")
                continue
        if not best.is_file():
            log(f"{name}: no checkpoint {best} to record")
            continue
        # The results card may since hold measurements the run's own card lacks (experiments.card_records.edit_card).
        if as_trained(load_checkpoint(best)[1]) != as_trained(json.loads(card.read_text())):
            raise ValueError(f"{best}'s card is not {card}: the results folder holds another run's card")
        test = load_test()
        result = prediction_record(
            best, test, data_identity(test), threads=torch.get_num_threads(), shown_as=_relative(best),
            card_file=card, card_shown_as=_relative(card),
            what=f"{name} seed {seed} of the sweep {sweep}: its tumour probability on each of the {len(test)} test "
                 "patches of pcam_public (tests/test_table3.py holds its card to it)",
            # The records name the command in the form they always have (python -m training hands it over).
            how_made=f"python -m training table3 {_relative(folder)} --record --runs-dir {_relative(runs_dir)}"
                     + ("" if sweep == "table3" else f" --sweep {sweep}"))
        out.parent.mkdir(parents=True, exist_ok=True)
        write_record(out, result)
        log(f"{name}: recorded -> {out}")
        written.append(out)
    return written


def _relative(path: Path) -> str:
    """``path`` relative to the repository (records name no path of this machine)."""
    return Path(os.path.relpath(Path(path).resolve(), REPO)).as_posix()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", nargs="?", default=SWEEP.results, help=f"the sweep's cards (default {SWEEP.results})")
    parser.add_argument("--runs-dir", help="the sweep's run folders: unfinished runs say how far they got, "
                                           "--record finds the checkpoints there")
    parser.add_argument("--data-dir", default=recipe(SWEEP.preset).data_dir, help="pcam_public (default %(default)s)")
    parser.add_argument("--record", action="store_true",
                        help="record finished runs' predictions on the test patches (needs --runs-dir)")
    parser.add_argument("--release", action="store_true",
                        help="measure the paper's release again (otherwise only where a claim needs it)")
    parser.add_argument("--write", action="store_true",
                        help=f"rewrite {' and '.join(DOCUMENTS)} between their table3 markers and keep the "
                             "release's summary")
    parser.add_argument("--seeds", action="store_true",
                        help="the table and the claims over every seed recorded (experiments/table3_over_seeds.py) and "
                             "attention on nuclei over seeds (experiments/fig5_over_seeds.py); with --write, into "
                             "README.md and docs/pathology.md")
    parser.add_argument("--sweep", choices=("table3", "table3_seeds"), default="table3",
                        help="whose runs --record records (table3_seeds: seeds 1 and 2; the table and the claims are "
                             "seed 0's, table3's)")
    parser.add_argument("--stand-in", action="append", default=[], metavar="MODEL=RECORD",
                        help="use this prediction record in MODEL's place (a demonstration: never written)")


def run(args: argparse.Namespace, log=print) -> int:
    """``python -m experiments table3``: print (and with --write keep) the table and the claims."""
    folder = Path(args.folder)
    try:
        stand_ins = {name: Path(path) for name, path in (item.split("=", 1) for item in args.stand_in)}
    except ValueError:
        log("error: --stand-in takes MODEL=RECORD")
        return 2
    if set(stand_ins) - set(MODELS):
        log(f"error: --stand-in for {', '.join(sorted(set(stand_ins) - set(MODELS)))}: not a Table 3 model")
        return 2
    if stand_ins and args.write:
        log("error: stand-ins are never written: --write goes without --stand-in")
        return 2
    if args.record and not args.runs_dir:
        log("error: --record needs --runs-dir (where the checkpoints are)")
        return 2
    if args.sweep != "table3" and not args.record:
        log(f"error: --sweep {args.sweep} only records its runs' predictions (--record --runs-dir): the table and "
            "the claims over seeds are not built yet")
        return 2
    runs_dir = Path(args.runs_dir) if args.runs_dir else None
    try:
        names, labels = read_test_labels(args.data_dir)
        listing = listing_sha256(names, labels)
        if args.seeds and not args.record:
            ours_claims = [claim for claim in CLAIMS if RELEASE not in claim[:2]]
            blocks = table3_over_seeds.seed_blocks(MODELS, ours_claims, labels, listing)
            for text in blocks.values():
                log(text)
            if args.write:
                table3_over_seeds.write_blocks(blocks, log)
            return 0
        test = functools.cache(lambda: load_dataset("pcam_public", args.data_dir).test)
        if args.record:
            record_runs(folder, runs_dir, test, log, args.sweep)
            if args.sweep != "table3":
                return 0
        models = ours(folder, labels, listing, runs_dir, stand_ins)
        stored_file = folder / RELEASE_FILE
        stored = json.loads(stored_file.read_text()) if stored_file.is_file() else None
        ours_p4m = models["p4m_densenet"].tumour
        needed = stored is None or (ours_p4m is not None and (stored.get("claim") or {}).get("b_tumour_sha256")
                                    != tumour_sha256(ours_p4m))
        models[RELEASE], summary = release(folder, labels, listing, test, measure=args.release or needed)
    except (DataError, ValueError, OSError) as error:
        log(f"error: {error}")
        return 2
    claim_list = claims(models, labels, summary)
    text = block(models, claim_list, _relative(folder))
    log(text)
    if args.write:
        _write(folder, models, claim_list, summary, text, log)
    return 0


def _write(folder: Path, models: dict[str, Model], claim_list: list[dict], summary: dict | None, text: str,
           log) -> None:
    """Keep the release's summary (with its claim, if measured now) and rewrite the documents' blocks."""
    if models[RELEASE].tumour is not None and summary is not None:
        claim = next(c for c in claim_list if c["a"] == RELEASE)
        if "mcnemar" in claim:
            summary["claim"] = {key: claim[key] for key in _KEPT_CLAIM}
            summary["claim"]["of"] = f"{PREDICTIONS}/p4m_densenet-seed{SEED}.json"
        path = folder / RELEASE_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, (json.dumps(summary, indent=1) + "\n").encode())
        log(f"{path}: the release's summary kept")
    for name in DOCUMENTS:
        log(f"{name}: {'rewritten' if rewrite_block(REPO / name, BEGIN, END, text) else 'already up to date'}")
