"""Every card's 95 % test intervals are the one bootstrap's on its per-patch record, and recording them again keeps
the record bound to the card (``experiments.card_records``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from experiments.card_records import record_of, rerecord_intervals
from tests.conftest import REPO, require_shared
from tests.recorded_numbers import assert_same_numbers
from training.bootstrap import describe
from training.provenance import sha256_file

LABELS = REPO / "../shared/data/pcam_public/labels.csv"
CARDS = sorted(card.relative_to(REPO) for pattern in ("checkpoints/*.json", "results/pcam_table3*/*.json")
               for card in REPO.glob(pattern) if "test_intervals" in json.loads(card.read_text()).get("metrics", {}))


@pytest.fixture(autouse=True)
def from_the_repo_root(monkeypatch):
    """Records name their data folder from the repo root, as every command of the docs runs."""
    require_shared(LABELS, f"{LABELS} not found (pcam_public lives in ../shared/data)")
    monkeypatch.chdir(REPO)


def test_the_cards_with_intervals_are_the_pcam_models():
    names = {card.stem for card in CARDS}
    assert {"fa_p4m_densenet_pcam", "p4m_densenet_pcam", "fa_p4_densenet_pcam"} <= names
    assert sum(name.endswith("-seed0") for name in names) == 5 and len(CARDS) >= 17


@pytest.mark.parametrize("card", CARDS, ids=str)
def test_each_card_holds_the_intervals_of_its_record(card):
    """Recomputed here, perhaps on another CPU than the one that recorded them: equal to float64 round-off."""
    old, new = rerecord_intervals(card, write=False)
    assert_same_numbers(new, old, f"{card}: record its intervals again (python -m experiments intervals {card})")


def _copy(card: Path, root: Path) -> Path:
    """The card and its record under ``root``, at the same relative places."""
    for path in (card, record_of(card)):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, root / path)
    return root / card


def test_recording_again_rewrites_the_intervals_and_binds_the_record_to_the_new_card(tmp_path):
    card = _copy(Path("results/pcam_table3/densenet-seed0.json"), tmp_path)
    data = json.loads(card.read_text())
    data["metrics"]["test_intervals"]["auc"]["low"] = 0.5
    card.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    record = json.loads(record_of(card).read_text())
    record["card_sha256"] = sha256_file(card)  # as if it had been recorded of this card
    record_of(card).write_text(json.dumps(record, indent=1) + "\n")
    old, new = rerecord_intervals(card)
    assert old["auc"]["low"] == 0.5 and new["auc"]["low"] > 0.9
    assert json.loads(card.read_text())["metrics"]["test_intervals"] == new
    assert json.loads(record_of(card).read_text())["card_sha256"] == sha256_file(card)
    assert rerecord_intervals(card, write=False) == (new, new)


def test_a_record_that_does_not_name_the_card_as_it_is_is_refused(tmp_path):
    card = _copy(Path("results/pcam_table3/densenet-seed0.json"), tmp_path)
    card.write_text(card.read_text().replace('"arch": "densenet"', '"arch": "densenet" '))
    with pytest.raises(ValueError, match=r"densenet-seed0\.json does not name .*densenet-seed0\.json as it is now "
                                         r"\(its card_sha256 differs\): record it again"):
        rerecord_intervals(card)


def test_a_card_without_a_record_is_named(tmp_path):
    card = tmp_path / "results" / "pcam_table3" / "densenet-seed0.json"
    card.parent.mkdir(parents=True)
    shutil.copy("results/pcam_table3/densenet-seed0.json", card)
    with pytest.raises(FileNotFoundError, match=r"densenet-seed0\.json: no per-patch record at .*test_predictions"):
        rerecord_intervals(card)


def test_the_retired_pcam_public_checkpoints_hold_the_one_bootstraps_intervals():
    """Measured from their weights (no record): ``python -m experiments intervals checkpoints/retired/*.json``. The
    retired subset and demo models' readers are retired with them: their cards keep the earlier draws' intervals."""
    for card in sorted((REPO / "checkpoints" / "retired").glob("*.json")):
        data = json.loads(card.read_text())
        intervals = data["metrics"].get("test_intervals")
        if data["dataset"]["name"] == "pcam_public":
            assert intervals["auc"]["method"] == describe(), f"{card.name}: python -m experiments intervals {card.name}"
        elif intervals:
            assert intervals["auc"]["method"] == "stratified bootstrap, 2000 resamples", card.name
