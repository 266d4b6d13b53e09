"""Listing shipped checkpoints and loading uploaded ones, with a clear message for every bad upload."""

import io
import pickle

import numpy as np
import pytest
import torch
from conftest import reference_path
from test_app_compute import MAP_TOLERANCE, PROBABILITY_TOLERANCE, calibrated, card_for
from test_checkpoint import Exploit  # a pickle that would run a command: one for every loader's test

import models
from app.analysis.checkpoints import (
    CheckpointError,
    list_checkpoints,
    load_listed,
    load_uploaded_checkpoint,
    upload_architectures,
)
from app.analysis.compute import analyse

F_ATT_P4CNN = "checkpoints/model_f_att_p4cnn_optim_adam_lr_0.001_wd_0.0001_seed_0/model.pth"
PCAM_DENSENET = (
    "checkpoints/model_f_att_p4m_densenet_optim_adam_lr_0.001_wd_0.0001_seed_1_dilatedkernelseverywhere_pat20onmaxacc"
    "/model.pth"
)


def card(test_error=0.021) -> dict:
    return {
        **card_for("fa_p4cnn"),
        "dataset": {"name": "rot-MNIST"},
        "metrics": {"test_error": test_error},
        "class_names": [str(i) for i in range(10)],
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("checkpoints")
    model = calibrated("fa_p4cnn")
    models.save_checkpoint(model, folder / "fa_p4cnn_rot_mnist.safetensors", card())
    return folder, model


def test_missing_or_empty_folder_lists_nothing(tmp_path):
    assert list_checkpoints(tmp_path / "absent") == []
    assert list_checkpoints(tmp_path) == []


def test_listing_reads_cards_and_flags_broken_files(saved):
    folder, _ = saved
    (folder / "broken.safetensors").write_bytes(b"not a safetensors file")
    entries = {entry.name: entry for entry in list_checkpoints(folder)}
    good = entries["fa_p4cnn_rot_mnist"]
    assert (good.arch, good.dataset, good.group, good.test_error) == ("fa_p4cnn", "rot-MNIST", "p4", 0.021)
    assert good.label == "fa_p4cnn_rot_mnist: fa_p4cnn, rot-MNIST, p4, test error 2.10 %"
    assert entries["broken"].error and "unreadable" in entries["broken"].label
    model, loaded_card = load_listed(good)
    assert not model.training and loaded_card["class_names"][3] == "3"
    (folder / "broken.safetensors").unlink()


def test_uploaded_safetensors_carries_its_card(saved):
    folder, original = saved
    data = (folder / "fa_p4cnn_rot_mnist.safetensors").read_bytes()  # one file: the card is embedded
    model, loaded = load_uploaded_checkpoint(data, "my_model.safetensors")
    assert loaded["metrics"]["test_error"] == 0.021 and loaded["input"]["transposed"]
    image = np.random.default_rng(0).random((1, 28, 28)).astype(np.float32)
    ours, theirs = analyse(model, loaded, image), analyse(original, loaded, image)
    assert np.allclose(ours.probabilities, theirs.probabilities)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_bad_uploads_get_clear_messages(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    buffer = io.BytesIO()
    torch.save({"c1.weight": Exploit()}, buffer)
    wrong_weights = io.BytesIO()
    torch.save(models.build_model("p4cnn").state_dict(), wrong_weights)
    cifar = io.BytesIO()
    torch.save(models.build_model("p4_allcnnc").state_dict(), cifar)
    cases = [
        (b"", "model.safetensors", None, "model.safetensors is empty"),
        (b"\x00" * 100, "model.safetensors", None, "model.safetensors is not a readable safetensors file"),
        (b"abc", "model.onnx", None, "upload a .safetensors checkpoint"),
        (b"abc", "model.pth", None, "model.pth is not a loadable PyTorch state dict"),
        (pickle.dumps({"c1.weight": Exploit()}), "evil.pth", "p4cnn", "evil.pth is not a loadable PyTorch state dict"),
        (buffer.getvalue(), "evil.pth", "p4cnn", "evil.pth is not a loadable PyTorch state dict"),
        (wrong_weights.getvalue(), "p4cnn.pth", "a_p4cnn", "p4cnn.pth does not fit a_p4cnn"),
        (wrong_weights.getvalue(), "p4cnn.pth", "p5cnn", "p4cnn.pth: unknown model 'p5cnn'"),
        (cifar.getvalue(), "allcnnc.pth", "p4_allcnnc", "allcnnc.pth: the paper released no cifar10 checkpoint"),
    ]
    for data, name, arch, message in cases:
        with pytest.raises(CheckpointError, match=message):
            load_uploaded_checkpoint(data, name, arch)
    with pytest.raises(CheckpointError, match="limit is"):
        load_uploaded_checkpoint(b"x" * 2048, "big.safetensors", max_bytes=1024)
    for data, message in [(pickle.dumps({"c1.weight": Exploit()}), "evil.pth is not a loadable PyTorch state dict"),
                          (b"", "evil.pth is empty"), (b"x" * 2048, "evil.pth has 0 MB; the limit is 0 MB")]:
        with pytest.raises(CheckpointError, match=message):
            upload_architectures(data, "evil.pth", max_bytes=1024)
    assert not (tmp_path / "pwned.txt").exists()


def test_uploaded_pth_architecture_comes_from_its_weights():
    buffer = io.BytesIO()
    torch.save({f"module.{k}": v for k, v in models.build_model("a_p4cnn").state_dict().items()}, buffer)
    assert upload_architectures(buffer.getvalue(), "mine.pth") == ["a_p4cnn"]
    model, card = load_uploaded_checkpoint(buffer.getvalue(), "mine.pth")
    assert model.arch == card["arch"] == "a_p4cnn" and card["source"].endswith("uploaded as mine.pth")
    partial = io.BytesIO()
    torch.save({k: v for k, v in models.build_model("a_p4cnn").state_dict().items() if k != "c1.weight"}, partial)
    with pytest.raises(CheckpointError, match=r"^part.pth fits no registered architecture \(57 tensors\); the "
                                              r"nearest, a_p4cnn: missing \['c1.weight'\]$"):
        upload_architectures(partial.getvalue(), "part.pth")


def test_paper_checkpoint_upload_is_exactly_equivariant():
    data = reference_path(F_ATT_P4CNN).read_bytes()
    model, loaded = load_uploaded_checkpoint(data, "model.pth", "f_att_p4cnn")
    assert model.arch == "fa_p4cnn" and loaded["input"]["transposed"]
    digit = np.zeros((1, 28, 28), np.float32)
    digit[0, 6:22, 12:16] = 1  # a "1", upright in the user's frame
    result = analyse(model, loaded, digit)
    assert result.probability_error <= PROBABILITY_TOLERANCE
    for layer in list(result.attention.values()) + list(result.features.values()):
        assert layer.relative_error.max() <= MAP_TOLERANCE, layer.name


def test_paper_pcam_checkpoint_upload():
    data = reference_path(PCAM_DENSENET).read_bytes()
    assert upload_architectures(data, "model.pth") == ["p4m_densenet"]  # the paper calls it f_att_p4m_densenet
    model, loaded = load_uploaded_checkpoint(data, "model.pth")
    assert model.arch == "p4m_densenet" and not loaded["input"]["transposed"]
    assert (loaded["group"], loaded["class_names"]) == ("p4m", ["no_tumor", "tumor"])
    patch = np.random.default_rng(0).random((3, 96, 96)).astype(np.float32)
    result = analyse(model, loaded, patch)
    assert result.attention == {} and len(result.elements) == 8  # a plain p4m DenseNet: arrows from its features
    assert max(layer.relative_error.max() for layer in result.features.values()) <= MAP_TOLERANCE
    assert result.probability_error <= PROBABILITY_TOLERANCE
