"""The released checkpoints of the paper's code, imported: every array of the reference files, to 1e-4."""

import numpy as np
import pytest
import torch
from conftest import reference_path

import models

TOL = 1e-4
CHECKPOINTS = {
    "z2cnn": ("model_z2cnn_optim_adam_lr_0.001_wd_0.0001_seed_0", "z2cnn.npz"),
    "p4cnn": ("model_p4cnn_optim_adam_lr_0.001_wd_0.0001_seed_0", "p4cnn.npz"),
    "fa_p4cnn": ("model_f_att_p4cnn_optim_adam_lr_0.001_wd_0.0001_seed_0", "f_att_p4cnn.npz"),
    "a_p4cnn": ("model_att_p4cnn_optim_adam_lr_0.001_wd_0.0001_seed_0", "att_p4cnn.npz"),
    "p4m_densenet": (
        "model_f_att_p4m_densenet_optim_adam_lr_0.001_wd_0.0001_seed_1_dilatedkernelseverywhere_pat20onmaxacc",
        "pcam_p4m_densenet.npz",
    ),
}


def load(arch):
    folder, npz = CHECKPOINTS[arch]
    model = models.import_reference_checkpoint(reference_path(f"checkpoints/{folder}/model.pth"), arch)
    return model, np.load(reference_path(npz))


def rot(x, k):
    return torch.rot90(x, k, dims=(-2, -1))


def hflip(x):
    return torch.flip(x, dims=(-1,))


def feature_array(name):
    """``feat_<layer>_<rot|hflip_rot>`` -> (our layer name, suffix); None for other arrays."""
    for suffix in ("hflip_rot", "rot"):
        if name.startswith("feat_") and name.endswith(f"_{suffix}"):
            layer = name[len("feat_"):-len(suffix) - 1]
            return {"cout": "c_out"}.get(layer, layer), suffix
    return None


def close(actual, expected, what):
    err = (actual - torch.from_numpy(np.asarray(expected))).abs().max().item()
    assert err <= TOL, f"{what}: max abs error {err:.2e} > {TOL}"


@pytest.mark.parametrize("arch", sorted(CHECKPOINTS))
def test_checkpoint_reproduces_every_reference_array(arch):
    model, ref = load(arch)
    x = torch.from_numpy(ref["inputs"])
    checked = set()
    with torch.no_grad():
        close(model(x), ref["logits"], "logits")
        checked.add("logits")
        for k in range(4):
            for moved, suffix in ((rot(x, k), "rot"), (rot(hflip(x), k), "hflip_rot")):
                logits, trace = model.trace(moved)
                close(logits, ref[f"logits_{suffix}"][k], f"logits_{suffix}[{k}]")
                checked.add(f"logits_{suffix}")
                for name in ref.files:
                    parts = name.split("_")
                    if suffix == "rot" and name.startswith("att_") and name.endswith("_rot"):
                        maps = trace.attention[parts[1]]
                        close(maps.channel if parts[2] == "ch" else maps.spatial, ref[name][k], f"{name}[{k}]")
                        checked.add(name)
                    feature = feature_array(name)
                    if feature and feature[1] == suffix and k < ref[name].shape[0]:
                        close(trace.features[feature[0]], ref[name][k], f"{name}[{k}]")
                        checked.add(name)
    if arch == "p4m_densenet":
        for label, transform in (("identity", lambda t: t), ("rot90", lambda t: rot(t, 1)), ("hflip", hflip)):
            _, trace = model.trace(transform(x[:1]))
            close(trace.features["c1"][0], ref[f"feat_c1_input0_{label}"], f"feat_c1_input0_{label}")
            checked.add(f"feat_c1_input0_{label}")
        close((torch.from_numpy(ref["inputs_raw01"]) - torch.tensor(model.card["input"]["mean"])[:, None, None])
              / torch.tensor(model.card["input"]["std"])[:, None, None], ref["inputs"], "card normalisation")
        checked |= {"inputs_raw01", "norm_mean", "norm_std"}
    if arch == "fa_p4cnn":
        checked.add("vis_product_map_rot")  # a plot of theirs, built from the spatial maps checked above
    assert set(ref.files) - {"inputs"} <= checked, f"unchecked arrays: {set(ref.files) - {'inputs'} - checked}"


def test_import_card_carries_input_conventions():
    model, _ = load("p4cnn")
    assert model.card["input"] == dict(size=28, channels=1, mean=[0.1307], std=[0.3081], transposed=True)
    assert not model.training
