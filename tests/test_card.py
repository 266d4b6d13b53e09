"""One card schema for our checkpoints and the paper's releases: every card passes the validator the loader uses,
and a field of the wrong type is refused with a message naming it."""

import json
import re

import pytest
from conftest import RELEASES, REPO, release_path

import models
from app.analysis.checkpoints import error_text, list_checkpoints
from app.analysis.pathology import is_pathology
from models.card import CheckpointError, validate_card
from models.reference_import import PAPER_LOG_NOTE, reference_card

SHIPPED_CARDS = sorted((REPO / "checkpoints").glob("**/*.json"))


def good_card() -> dict:
    return {"arch": "p4cnn", "config": {}, "group": "p4",
            "input": dict(size=28, channels=1, mean=[0.1307], std=[0.3081], transposed=False),
            "dataset": {"name": "rot_mnist"}, "class_names": [str(d) for d in range(10)],
            "metrics": {"test_error": 0.02}, "equivariance_error": None}


@pytest.mark.parametrize("path", SHIPPED_CARDS, ids=lambda p: p.stem)
def test_every_shipped_card_passes(path):
    validate_card(json.loads(path.read_text()), path.name)


@pytest.mark.parametrize("arch", sorted(RELEASES))
def test_reference_cards_have_our_schema(arch):
    card = reference_card(arch)
    validate_card(card)
    model = models.build_model(arch)
    assert card["arch"] == arch and card["group"] == (model.group.name if model.group else None)
    assert card["parameters"] == sum(p.numel() for p in model.parameters())
    assert card["class_names"] == card["dataset"]["class_names"] and card["equivariance_error"] is None
    # The paper's logged figure is labelled as such, never as a test error we measured.
    assert "test_error" not in card["metrics"] and card["metrics"]["paper_logged_test_error"] > 0
    assert any(note.startswith(PAPER_LOG_NOTE) for note in card["notes"])


def test_the_paper_pcam_release_reads_as_a_p4m_tumour_classifier():
    card = reference_card("p4m_densenet")
    assert (card["group"], card["class_names"], card["dataset"]["name"]) == ("p4m", ["no_tumor", "tumor"], "pcam")
    assert is_pathology(card) and error_text(card) == "the paper's log: test error 10.88 %"
    assert error_text(reference_card("a_p4cnn")) == "the paper's log: test error 1.64 % (selected on the test set)"
    assert error_text(good_card()) == "test error 2.00 %"


@pytest.mark.parametrize("arch", sorted(RELEASES))
def test_imported_releases_carry_a_valid_card(arch):
    model = models.import_reference_checkpoint(release_path(arch), arch)
    validate_card(model.card)
    assert model.card == reference_card(arch, source=RELEASES[arch])


@pytest.mark.parametrize("change, message", [
    (dict(dataset="PatchCamelyon"), "model card: 'dataset' must be a dict with a 'name' (got str 'PatchCamelyon')"),
    (dict(group="p6"), "model card: 'group' must be one of ['p4', 'p4m'] or null (got str 'p6')"),
    (dict(class_names="tumour"), "model card: 'class_names' must be a non-empty list of str (got str 'tumour')"),
    (dict(metrics={"test_error": "10 %"}), "model card: metric 'test_error' must be a number, a dict or null "
                                           "(got str '10 %')"),
    (dict(metrics={"test_reliability": {"bin_edges": [0, 1], "accuracy": [], "count": []}}),
     "model card: metric 'test_reliability' must hold lists bin_edges, accuracy and count, one accuracy and count "
     "per bin"),
    (dict(equivariance_error=1e-7), "model card: 'equivariance_error' must be a dict or null (got float 1e-07)"),
    (dict(notes="one note"), "model card: 'notes' must be a list of str (got str 'one note')"),
    (dict(dataset={"name": "pcam", "notes": ["a"]}), "model card: 'dataset.notes' must be a str (got list ['a'])"),
    (dict(input=dict(size=28, channels=1, mean=[0.1], std=[0.3], transposed="yes")),
     "model card: input transposed must be true or false (got str 'yes')"),
    (dict(input=dict(size=28, channels=1, mean=[0.1], std=[0.0], transposed=False)),
     "model card: input std must be positive (got [0.0])"),
])
def test_wrong_types_are_named(change, message):
    with pytest.raises(CheckpointError) as raised:
        validate_card({**good_card(), **change})
    assert str(raised.value) == message


def test_missing_fields_are_named():
    card = good_card()
    del card["class_names"]
    with pytest.raises(CheckpointError, match=r"^model card lacks field\(s\) \['class_names'\]$"):
        validate_card(card)
    with pytest.raises(CheckpointError, match=r"^model card is not a JSON object \(list \[\]\)$"):
        validate_card([])


def test_loader_and_listing_refuse_a_card_of_the_wrong_type(tmp_path):
    path = tmp_path / "p4cnn.safetensors"
    models.save_checkpoint(models.build_model("p4cnn"), path, good_card())
    card_file = path.with_suffix(".json")
    card_file.write_text(json.dumps({**json.loads(card_file.read_text()), "dataset": "PatchCamelyon"}))
    expected = f"model card of {path}: 'dataset' must be a dict with a 'name'"
    with pytest.raises(CheckpointError, match=re.escape(expected)):
        models.load_checkpoint(path)
    entry, = list_checkpoints(tmp_path)
    assert entry.error == "its model card: 'dataset' must be a dict with a 'name' (got str 'PatchCamelyon')"
    card_file.write_text(json.dumps({**json.loads(card_file.read_text()), "dataset": {"name": "x"}, "group": "p4m"}))
    with pytest.raises(CheckpointError, match="group 'p4m', but p4cnn has group 'p4'"):
        models.load_checkpoint(path)
