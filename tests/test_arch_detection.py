"""An architecture found from a state dict's names and shapes: every registered one (random weights) and the five
releases of the paper's code, a message naming the nearest where none fits, every fit where several do."""

import pytest
import torch
from conftest import RELEASES, release_path

import models
from models import registry
from models.arch_detection import detect_architecture, matching_architectures, signature
from models.card import CheckpointError
from models.reference_import import import_reference_checkpoint, read_state_dict


@pytest.mark.parametrize("arch", models.list_models())
def test_every_registered_architecture_is_found_from_random_weights(arch):
    torch.manual_seed(0)
    state = models.build_model(arch).state_dict()
    assert matching_architectures(state) == [arch]
    assert matching_architectures({f"module.{key}": value for key, value in state.items()}) == [arch]


def test_no_two_registered_architectures_share_a_signature():
    signatures = {tuple(sorted(signature(arch).items())) for arch in models.list_models()}
    assert len(signatures) == len(models.list_models())


@pytest.mark.parametrize("arch", sorted(RELEASES))
def test_each_release_is_found_and_imports_without_naming_it(arch):
    path = release_path(arch)
    assert detect_architecture(read_state_dict(path), str(path)) == [arch]
    assert import_reference_checkpoint(path).arch == arch


def test_a_state_dict_that_fits_nothing_names_the_nearest():
    state = dict(models.build_model("p4cnn").state_dict())
    del state["c1.weight"]
    state["extra.weight"] = torch.zeros(3)
    with pytest.raises(CheckpointError) as raised:
        detect_architecture(state, "mine.pth")
    assert str(raised.value) == ("mine.pth fits no registered architecture (37 tensors); the nearest, p4cnn: "
                                 "missing ['c1.weight']; unexpected ['extra.weight']")


def test_where_two_fit_both_are_returned(monkeypatch, tmp_path):
    monkeypatch.setitem(registry._REGISTRY, "p4cnn_twin", registry._REGISTRY["p4cnn"])
    state = models.build_model("p4cnn").state_dict()
    assert matching_architectures(state) == ["p4cnn", "p4cnn_twin"]
    path = tmp_path / "twin.pth"
    torch.save(state, path)
    with pytest.raises(CheckpointError, match=r"twin.pth fits 2 architectures \(p4cnn, p4cnn_twin\): name one$"):
        import_reference_checkpoint(path)
    assert import_reference_checkpoint(path, "p4cnn").arch == "p4cnn"
