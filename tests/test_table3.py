"""Table 3 as a controlled experiment (``python -m experiments table3``): rows for missing runs, claims that wait,
the README's and docs/pathology.md's block between markers, the records of the sweep's runs and the release's
kept summary, and the machinery on real predictions now: the two shipped PCam checkpoints' records in the places
of alpha_F-p4m and p4m.

The test patches' labels come from ``../shared/data/pcam_public/labels.csv`` and the release from
``../shared/reference``; without them the tests that need them skip, or fail under REQUIRE_REFERENCE=1.
``AAGC_TABLE3_PARTS=all`` (or ``0,5``) recomputes more of the release's parts than the one a fixed seed picks.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from experiments import table3
from experiments.card_records import edit_card
from experiments.cli import main
from experiments.generated_blocks import replace_between_markers
from experiments.paired_tests import binomial_tail, verdict
from experiments.paper_release import (
    PART_SIZE,
    PARTITION_SEED,
    PARTS,
    RELEASE_CHECKPOINT,
    classes_sha256,
    load_release,
    measure_parts,
    parts,
)
from experiments.patch_records import (
    card_metrics,
    card_tolerances,
    listing_sha256,
    read_record,
    read_test_labels,
    tumour_probability,
)
from experiments.table3 import BEGIN, CLAIMS, END, MODELS, RELEASE, Model, block, claims, claims_markdown, ours
from models import build_model, load_checkpoint, save_checkpoint
from tests.conftest import RELEASES, REPO, release_path, require_shared
from tests.recorded_numbers import assert_same_numbers, classes_of_digest
from training.data import load_dataset
from training.data.pcam_public import PatchRecord, PublicSplit
from training.provenance import sha256_file

FOLDER = REPO / "results" / "pcam_table3"
DATA = REPO / "../shared/data/pcam_public"
SHIPPED = REPO / "results" / "pcam_test_predictions"
STAND_INS = {"fa_p4m_densenet": SHIPPED / "fa_p4m_densenet_pcam.json",
             "p4m_densenet": SHIPPED / "p4m_densenet_pcam.json"}
RECORDS = sorted((FOLDER / table3.PREDICTIONS).glob("*.json"))
SUMMARY = FOLDER / table3.RELEASE_FILE
CHECK_SEED = 3  # picks the release's part recomputed by default
SAMPLE, SAMPLE_SEED = 128, 2041  # patches of a run's record recomputed where its checkpoint is here


@pytest.fixture(scope="module")
def truth():
    """(labels, listing digest) of the 1,944 test patches, from labels.csv."""
    require_shared(DATA / "labels.csv", f"{DATA / 'labels.csv'} not found (pcam_public lives in ../shared/data)")
    names, labels = read_test_labels(DATA)
    return labels, listing_sha256(names, labels)


@pytest.fixture(scope="module")
def test_split():
    require_shared(DATA / "labels.csv", f"{DATA / 'labels.csv'} not found (pcam_public lives in ../shared/data)")
    return load_dataset("pcam_public", DATA).test


def interval(value: float, low: float, high: float) -> dict:
    return {"value": value, "low": low, "high": high}


def made_up(name: str, accuracy: float, tumour=None) -> Model:
    return Model(name, source=f"`{name}-seed0`", tumour=tumour, intervals={
        "accuracy": interval(accuracy, accuracy - 0.02, accuracy + 0.02), "auc": interval(0.9, 0.89, 0.91),
        "nll": interval(0.3, 0.28, 0.33), "ece": interval(0.03, 0.02, 0.04)})


def test_table_with_missing_models_says_what_each_is_waiting_for():
    models = {name: Model(name, status="not trained yet") for name in MODELS}
    models["p4m_densenet"] = Model("p4m_densenet", status="in progress: epoch 19 of 40")
    models["densenet"] = made_up("densenet", 0.8, tumour=np.array([0.2, 0.9], dtype=np.float32))
    models[RELEASE] = Model(RELEASE, status="not measured: needs ../shared/reference", waits_for="../shared/reference")
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table3.table_markdown(models).splitlines()[2:]}
    assert list(rows)[:5] == list(MODELS) and len(rows) == 6
    assert rows["densenet"] == ("| densenet | `densenet-seed0` | 80.0 [78.0, 82.0] | 0.900 [0.890, 0.910] "
                                "| 0.300 [0.280, 0.330] | 0.030 [0.020, 0.040] | 84.07 (15.93) |")
    assert "| in progress: epoch 19 of 40 | - | - | - | 88.36 (11.64) |" in rows["p4m_densenet"]
    assert rows["p4_densenet"].endswith("| not trained yet | - | - | - | - |"), "no paper figure is made up"
    assert "89.12 (10.88)" in rows["fa_p4m_densenet"]
    found = {claim["why"]: claim for claim in claims(models, np.array([0, 1]))}
    assert list(found) == [why for _, _, why in CLAIMS]
    assert found["p4 beats Z2"]["waiting"] == "waiting for p4_densenet"
    assert found["p4m beats p4"]["waiting"] == "waiting for p4m_densenet and p4_densenet"
    assert all("waiting" in claim for claim in found.values())
    rendered = claims_markdown(list(found.values()))
    assert "| p4 beats Z2 | p4_densenet | densenet | waiting for p4_densenet | - |" in rendered


def test_a_card_without_its_record_shows_its_numbers_and_its_claims_wait_for_the_record(tmp_path):
    card = {"metrics": {"test_intervals": made_up("densenet", 0.8).intervals}}
    (tmp_path / "densenet-seed0.json").write_text(json.dumps(card))
    models = ours(tmp_path, np.array([0, 1]), "listing")
    assert models["densenet"].intervals == card["metrics"]["test_intervals"] and models["densenet"].tumour is None
    models[RELEASE] = Model(RELEASE, status="-", waits_for="the release")
    found = {claim["why"]: claim for claim in claims(models, np.array([0, 1]))}
    assert found["p4 beats Z2"]["waiting"] == "waiting for p4_densenet and densenet's predictions (--record)"


def test_a_record_of_another_card_is_refused(tmp_path):
    (tmp_path / "densenet-seed0.json").write_text("{}")
    (tmp_path / table3.PREDICTIONS).mkdir()
    (tmp_path / table3.PREDICTIONS / "densenet-seed0.json").write_text(json.dumps({"card_sha256": "0" * 64}))
    with pytest.raises(ValueError, match="--record"):
        ours(tmp_path, np.array([0, 1]), "listing")


def test_a_kept_release_claim_stands_in_only_for_the_p4m_predictions_it_was_computed_from(monkeypatch, tmp_path):
    """Without the reference the release's claim is read from its summary, if it was computed from these very
    predictions of our p4m_densenet; with other predictions it waits for the reference."""
    monkeypatch.setattr(table3, "release_path", lambda: tmp_path / "no_release.pth")
    labels = np.array([0, 1, 0, 1])
    release_now = Model(RELEASE, tumour=np.array([0.1, 0.9, 0.2, 0.8], dtype=np.float32))
    models = {name: Model(name, status="not trained yet") for name in MODELS}
    models["p4m_densenet"] = made_up("p4m_densenet", 0.5, tumour=np.array([0.6, 0.9, 0.2, 0.4], dtype=np.float32))
    computed = claims({**models, RELEASE: release_now}, labels)[-1]
    assert computed["mcnemar"]["only_a_right"] == 2 and computed["mcnemar"]["only_b_right"] == 0
    kept = {"claim": {key: computed[key] for key in ("accuracy", "mcnemar", "auc", "b_tumour_sha256")}}
    from_summary = claims({**models, RELEASE: Model(RELEASE, waits_for="the reference")}, labels, kept)[-1]
    assert from_summary == computed
    models["p4m_densenet"] = made_up("p4m_densenet", 0.5, tumour=np.array([0.6, 0.9, 0.2, 0.6], dtype=np.float32))
    other = claims({**models, RELEASE: Model(RELEASE, waits_for="the reference")}, labels, kept)[-1]
    assert other["waiting"] == "waiting for the reference"


def test_marker_rewrite_replaces_only_the_block():
    text = f"# Title\n\nbefore\n{BEGIN}\nold table\n{END}\nafter\n"
    expected = f"# Title\n\nbefore\n{BEGIN}\nnew\ntable\n{END}\nafter\n"
    assert replace_between_markers(text, BEGIN, END, "new\ntable") == expected
    again = replace_between_markers(text, BEGIN, END, "new\ntable\n")
    assert replace_between_markers(again, BEGIN, END, "new\ntable\n") == again
    for broken in (text.replace(END, ""), text + BEGIN + "\n", f"{END}\n{BEGIN}\n"):
        with pytest.raises(ValueError, match="expected one"):
            replace_between_markers(broken, BEGIN, END, "x")


def between_markers(path: Path) -> str:
    text = path.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1, f"{path.name}: one block of Table 3, between markers"
    return text.split(BEGIN + "\n", 1)[1].split(END, 1)[0]


def test_the_pathology_doc_holds_seed_0s_block_without_stand_ins_and_the_readme_the_seeds():
    doc = between_markers(REPO / "docs" / "pathology.md")
    assert table3.DOCUMENTS == ("docs/pathology.md",) and BEGIN not in (REPO / "README.md").read_text(), \
        "the README holds the table over seeds (experiments.table3_over_seeds.MARKERS), not seed 0's"
    assert "Stand-in" not in doc and "stand-in" not in doc
    for name in MODELS:
        assert f"\n| {name} | " in doc
    if SUMMARY.is_file():
        kept = json.loads(SUMMARY.read_text())["intervals"]
        assert table3._interval(kept["accuracy"], percent=True) in doc


def test_stand_ins_are_never_written(tmp_path, capsys):
    before = [(REPO / name).read_text() for name in table3.DOCUMENTS]
    argv = ["table3", str(tmp_path), "--stand-in", f"p4m_densenet={STAND_INS['p4m_densenet']}", "--write"]
    assert main(argv) == 2
    assert "never written" in capsys.readouterr().out
    assert [(REPO / name).read_text() for name in table3.DOCUMENTS] == before
    assert main(["table3", str(tmp_path), "--stand-in", "z2cnn=x.json"]) == 2


@pytest.fixture(scope="module")
def demonstration(truth, tmp_path_factory):
    """Every claim with the shipped fa_p4m_densenet_pcam and p4m_densenet_pcam in the places of alpha_F-p4m and
    p4m, the release left out; computed once (the intervals' bootstrap takes seconds)."""
    labels, listing = truth
    models = ours(tmp_path_factory.mktemp("empty_results"), labels, listing, stand_ins=STAND_INS)
    models[RELEASE] = Model(RELEASE, status="not measured in this test", waits_for="the release")
    return {claim["why"]: claim for claim in claims(models, labels)}, models


def test_the_claims_on_the_two_shipped_checkpoints_predictions(truth, demonstration):
    """alpha_F-p4m against p4m with the shipped fa_p4m_densenet_pcam and p4m_densenet_pcam in their places: real
    predictions on the real test patches, whose counts must agree with the records' own metrics."""
    labels, _ = truth
    found, models = demonstration
    claim = found["alpha_F-p4m beats p4m"]
    (fa, fa_tumour), (p4m, p4m_tumour) = (read_record(STAND_INS[name]) for name in ("fa_p4m_densenet", "p4m_densenet"))
    test, auc = claim["mcnemar"], claim["auc"]
    errors_fa, errors_p4m = (round(record["metrics"]["error"] * len(labels)) for record in (fa, p4m))
    assert sum(test[key] for key in ("both_right", "only_a_right", "only_b_right", "both_wrong")) == len(labels)
    assert test["only_a_right"] - test["only_b_right"] == errors_p4m - errors_fa
    assert test["only_b_right"] + test["both_wrong"] == errors_fa
    assert test["p"] == binomial_tail(test["only_a_right"], test["only_a_right"] + test["only_b_right"])
    assert auc["difference"] == pytest.approx(fa["metrics"]["auc"] - p4m["metrics"]["auc"], abs=1e-12)
    assert auc["low"] < auc["difference"] < auc["high"]
    # Since p4m_densenet_pcam is the controlled run (86.9 % against 87.0 %), the verdicts follow the p-values.
    assert claim["accuracy_verdict"] == verdict(test["p"], test["p_reversed"],
                                                test["only_a_right"] - test["only_b_right"])
    assert claim["auc_verdict"] == verdict(auc["p"], auc["p_reversed"], auc["difference"])
    assert models["fa_p4m_densenet"].intervals["accuracy"]["value"] == pytest.approx(1 - fa["metrics"]["error"])
    assert found["alpha_F-p4 already outperforms p4m"]["waiting"] == "waiting for fa_p4_densenet"
    assert found["the paper's release beats our p4m_densenet"]["waiting"] == "waiting for the release"
    text = block(models, list(found.values()))
    assert text.startswith("**Stand-ins, not Table 3:** p4m_densenet, fa_p4m_densenet")
    print(claims_markdown([claim]))


def test_the_command_runs_on_stand_ins_without_the_release(truth, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(table3, "release_path", lambda: tmp_path / "no_release.pth")
    argv = ["table3", str(tmp_path), "--data-dir", str(DATA), "--stand-in", f"p4m_densenet={STAND_INS['p4m_densenet']}"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("**Stand-ins, not Table 3:** p4m_densenet")
    assert "| p4m_densenet | stand-in: `p4m_densenet_pcam.json` | 86.9 [85.3, 88.3] | 0.946 [0.937, 0.955] |" in out
    assert "| alpha_F-p4m beats p4m | fa_p4m_densenet | p4m_densenet | waiting for fa_p4m_densenet |" in out
    assert "| not measured: needs ../shared/reference |" in out


@pytest.mark.parametrize("record_file", RECORDS, ids=lambda p: p.stem)
def test_each_runs_record_is_of_its_card_and_gives_its_test_metrics(record_file, truth):
    labels, listing = truth
    record, tumour = read_record(record_file)
    card_file = FOLDER / record_file.name
    assert record["card_sha256"] == sha256_file(card_file), f"{record_file.name} is not of {card_file.name}"
    assert record["data"]["files_labels_sha256"] == listing
    measured = card_metrics(tumour, labels)
    assert_same_numbers(measured, record["metrics"], "the record's metrics do not follow from its probabilities")
    card = json.loads(card_file.read_text())
    tolerance = card_tolerances(card)  # round-off, or a GPU's other kernels where the card was measured on one
    for name in ("error", "nll", "auc", "ece"):
        assert measured[name] == pytest.approx(card["metrics"][f"test_{name}"], abs=tolerance[name]), name


@pytest.mark.parametrize("record_file", RECORDS, ids=lambda p: p.stem)
def test_each_runs_record_is_what_its_checkpoint_computes_on_a_sample(record_file, test_split):
    record, tumour = read_record(record_file)
    checkpoint = REPO / record["checkpoint"]
    if not checkpoint.is_file():
        pytest.skip(f"{record['checkpoint']} is not on this machine (run folders are never committed)")
    assert sha256_file(checkpoint) == record["sha256"]
    model, card = load_checkpoint(checkpoint)
    sample = np.sort(np.random.default_rng(SAMPLE_SEED).choice(len(tumour), SAMPLE, replace=False))
    now = tumour_probability(model, card, test_split, sample)
    assert np.abs(now - tumour[sample]).max() <= 1e-5


def test_every_card_of_the_sweep_has_its_record():
    cards = sorted(FOLDER.glob("*.json"))
    missing = [card.name for card in cards if not (FOLDER / table3.PREDICTIONS / card.name).is_file()]
    assert not missing, f"record them: python -m experiments table3 results/pcam_table3 --record --runs-dir ../runs " \
                        f"({', '.join(missing)})"


def summary() -> dict:
    if not SUMMARY.is_file():
        pytest.skip(f"no {SUMMARY.relative_to(REPO)} yet: python -m experiments table3 --release --write keeps it")
    return json.loads(SUMMARY.read_text())


def test_release_summary_keeps_no_per_patch_values():
    def sizes(value):
        if isinstance(value, dict):
            for inner in value.values():
                yield from sizes(inner)
        elif isinstance(value, list):
            yield len(value)
            for inner in value:
                yield from sizes(inner)
        elif isinstance(value, str):
            yield len(value.split())
    kept = summary()
    assert max(sizes(kept)) <= max(PARTS, 40), "only per-part figures and digests of the release are kept"
    assert RELEASES["p4m_densenet"] in RELEASE_CHECKPOINT and kept["checkpoint"].startswith(RELEASE_CHECKPOINT)


def test_release_summary_is_consistent(truth):
    labels, listing = truth
    kept = summary()
    assert kept["data"]["files_labels_sha256"] == listing
    assert kept["data"]["patches"] == len(labels) == PARTS * PART_SIZE
    partition = kept["partition"]
    assert (partition["seed"], partition["parts"], partition["part_size"]) == (PARTITION_SEED, PARTS, PART_SIZE)
    assert hashlib.sha256(parts().astype(np.int64).tobytes()).hexdigest() == partition["indices_int64_sha256"]
    assert sum(kept["errors_by_part"]) == kept["errors"]
    assert kept["intervals"]["accuracy"]["value"] == pytest.approx(1 - kept["errors"] / len(labels), abs=1e-12)
    claim = kept.get("claim")
    ours_p4m = FOLDER / table3.PREDICTIONS / "p4m_densenet-seed0.json"
    if claim is not None and ours_p4m.is_file():
        assert claim["b_tumour_sha256"] == table3.tumour_sha256(read_record(ours_p4m)[1]), \
            "the kept release claim is of another p4m_densenet record: measure it again with --release --write"


def checked_parts() -> list[int]:
    chosen = os.environ.get("AAGC_TABLE3_PARTS", "").strip()
    if chosen == "all":
        return list(range(PARTS))
    if chosen:
        return [int(k) for k in chosen.split(",")]
    return [int(np.random.default_rng(CHECK_SEED).integers(PARTS))]


def test_release_recomputes_its_kept_part_figures(test_split):
    kept = summary()
    path = release_path("p4m_densenet")
    assert sha256_file(path) == kept["sha256"], "the release's .pth is not the one the summary measured"
    model = load_release()
    for k, tumour in measure_parts(model, test_split, checked_parts()).items():
        labels = test_split.labels[parts()[k]]
        # Equal where the class is decided on every CPU; a patch within round-off of 1/2 may take either side.
        both = np.stack([1 - tumour.astype(np.float64), tumour], axis=1)
        classes = classes_of_digest(both, kept["predicted_sha256_by_part"][k], classes_sha256)
        assert classes is not None, f"part {k}: other predicted classes than the kept digest's, beyond round-off"
        assert int((classes != labels).sum()) == kept["errors_by_part"][k], f"part {k}"
        assert float(tumour.astype(np.float64).sum()) == pytest.approx(kept["tumour_sum_by_part"][k], abs=1e-3)


def test_record_runs_records_a_finished_run_bound_to_its_card_and_checkpoint(tmp_path):
    """A run's checkpoint (an untrained planar DenseNet with a real card) measured on six made-up patches: the
    record names the card and the checkpoint by sha256, a second pass finds it up to date, and a card of another
    run is refused."""
    folder, runs = tmp_path / "results", tmp_path / "runs"
    best = runs / "pcam_table3-densenet-seed0" / "best.safetensors"
    card = json.loads((REPO / "results" / "pcam_public" / "densenet.json").read_text())
    written = save_checkpoint(build_model("densenet"), best, card)
    folder.mkdir()
    (folder / "densenet-seed0.json").write_text(json.dumps(written))
    images = np.random.default_rng(0).integers(0, 256, size=(6, 3, 96, 96), dtype=np.uint8)
    rows = [PatchRecord(f"test/{k}.jpg", k % 2, "test", "jpeg", False, "made up") for k in range(6)]
    split = PublicSplit(images, rows)
    out = table3.record_runs(folder, runs, lambda: split, log=lambda *_: None)
    assert out == [folder / table3.PREDICTIONS / "densenet-seed0.json"]
    record, tumour = read_record(out[0])
    assert record["sha256"] == sha256_file(best)
    assert record["card_sha256"] == sha256_file(folder / "densenet-seed0.json")
    assert record["data"]["files_labels_sha256"] == listing_sha256(split.names, split.labels) and len(tumour) == 6
    assert record["metrics"] == card_metrics(tumour, split.labels)
    assert not Path(record["checkpoint"]).is_absolute() and not Path(record["card"]).is_absolute()
    assert table3.record_runs(folder, runs, lambda: split, log=lambda *_: None) == []
    # Measured into the results card since (edit_card): still this run's card, recorded again once unbound.
    edit_card(folder / "densenet-seed0.json", lambda data: data.__setitem__("attention_on_nuclei", {"patches": 6}))
    (folder / table3.PREDICTIONS / "densenet-seed0.json").unlink()
    assert table3.record_runs(folder, runs, lambda: split, log=lambda *_: None) == out
    (folder / "densenet-seed0.json").write_text(json.dumps({**written, "notes": "another run"}))
    with pytest.raises(ValueError, match="another run's card"):
        table3.record_runs(folder, runs, lambda: split, log=lambda *_: None)
