"""Our checkpoint format round-trips; bad files give clear errors and never unpickle."""

import json
import os
import pickle

import pytest
import torch
from conftest import reference_path

import models
from models.checkpoint import CheckpointError, card_path

CARD = {
    "input": dict(size=28, channels=1, mean=[0.1307], std=[0.3081], transposed=False),
    "dataset": {"name": "rot_mnist", "notes": "test"},
    "class_names": [str(digit) for digit in range(10)],
    "metrics": {"test_error": 0.02},
}


def saved(tmp_path, name="fa_p4cnn", card=CARD):
    torch.manual_seed(0)
    model = models.build_model(name).eval()
    path = tmp_path / f"{name}.safetensors"
    written = models.save_checkpoint(model, path, card)
    return model, path, written


def test_round_trip_reproduces_the_model(tmp_path):
    model, path, written = saved(tmp_path)
    loaded, card = models.load_checkpoint(path)
    x = torch.randn(3, 1, 28, 28)
    assert torch.equal(loaded(x), model(x)) and not loaded.training
    assert card == written == json.loads(card_path(path).read_text())
    assert card["arch"] == "fa_p4cnn" and card["group"] == "p4" and card["parameters"] == 29_462
    assert card["equivariance_error"]["max_relative_logit_error"] < 1e-12
    assert loaded.config == model.config


def test_card_embedded_in_the_weights_is_enough(tmp_path):
    _, path, written = saved(tmp_path, "p4m_densenet", dict(CARD, input=dict(CARD["input"], size=96, channels=3,
                                                                            mean=[0.5] * 3, std=[0.2] * 3)))
    card_path(path).unlink()
    assert models.load_checkpoint(path)[1] == written


def test_missing_card_fields_are_named(tmp_path):
    with pytest.raises(CheckpointError, match=r"lacks field\(s\) \['input'"):
        saved(tmp_path, card={"dataset": "x", "metrics": {}})
    with pytest.raises(CheckpointError, match="one value per channel"):
        saved(tmp_path, card=dict(CARD, input=dict(CARD["input"], mean=[0.1, 0.2])))


def test_bad_files_give_clear_errors(tmp_path):
    _, path, _ = saved(tmp_path)
    with pytest.raises(CheckpointError, match="no checkpoint file"):
        models.load_checkpoint(tmp_path / "absent.safetensors")
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        models.load_checkpoint(truncated)
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        models.load_checkpoint(empty)
    card_path(path).write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        models.load_checkpoint(path)
    card = dict(CARD, arch="p4cnn", config={}, group="p4", equivariance_error=None)
    card_path(path).write_text(json.dumps(card))  # weights of fa_p4cnn, card says p4cnn
    with pytest.raises(CheckpointError, match="does not fit p4cnn: unexpected"):
        models.load_checkpoint(path)
    card_path(path).write_text(json.dumps(dict(card, arch="p9cnn")))
    with pytest.raises(CheckpointError, match="unknown model 'p9cnn'"):
        models.load_checkpoint(path)


class Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned > pwned.txt",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_reference_import_never_unpickles_objects(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    raw, zipped = tmp_path / "raw.pth", tmp_path / "zipped.pth"
    raw.write_bytes(pickle.dumps({"c1.weight": Exploit()}))
    torch.save({"c1.weight": Exploit()}, zipped)  # pickling only records the call; nothing runs
    for evil in (raw, zipped):
        with pytest.raises(CheckpointError, match="not a loadable PyTorch state dict"):
            models.import_reference_checkpoint(evil, "p4cnn")
    assert not (tmp_path / "pwned.txt").exists()
    with pytest.raises(CheckpointError, match="no checkpoint file"):
        models.import_reference_checkpoint(tmp_path / "absent.pth", "p4cnn")


def test_reference_import_rejects_the_wrong_architecture():
    path = reference_path("checkpoints/model_p4cnn_optim_adam_lr_0.001_wd_0.0001_seed_0/model.pth")
    with pytest.raises(CheckpointError, match="does not fit fa_p4cnn: missing"):
        models.import_reference_checkpoint(path, "fa_p4cnn")


def test_imported_checkpoint_saves_in_our_format(tmp_path):
    path = reference_path("checkpoints/model_p4cnn_optim_adam_lr_0.001_wd_0.0001_seed_0/model.pth")
    model = models.import_reference_checkpoint(path, "p4cnn")
    models.save_checkpoint(model, tmp_path / "p4cnn.safetensors")  # card taken from model.card
    loaded, card = models.load_checkpoint(tmp_path / "p4cnn.safetensors")
    x = torch.randn(2, 1, 28, 28)
    assert torch.equal(loaded(x), model(x)) and card["input"]["transposed"] is True
