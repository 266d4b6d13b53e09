"""The app's compute layer: maps(g.x) == g.maps(x) for every element and layer, invariant predictions, frames."""

import numpy as np
import pytest
import torch

import models
from app.analysis.angles import angle_deviation
from app.analysis.compute import analyse
from app.analysis.frames import InputFrame, transpose_conjugation
from app.analysis.reductions import MapSelection, reduce_attention
from app.analysis.transforms import apply_element, rotate_by_angle

# float32 round-off of these networks is about 1e-6 relative; 1e-4 leaves room and catches any real error.
MAP_TOLERANCE = 1e-4
PROBABILITY_TOLERANCE = 1e-5

# Small models covering every layer layout: planar, plain p4, full (lifting and group), channel-only,
# spatial-only, alpha_F and alpha_RH on p4, alpha_F and plain p4m DenseNets (96 x 96), full attention on p4m.
CASES = {
    "z2cnn": {}, "p4cnn": {}, "a_p4cnn": {}, "ach_p4cnn": {}, "asp_p4cnn": {}, "fa_p4cnn": {}, "arh_p4cnn": {},
    "fa_p4m_densenet": {}, "p4m_densenet": {}, "a_p4m_allcnnc": dict(channels=2),
}


def card_for(name: str, transposed: bool | None = None) -> dict:
    info = models.model_info(name)
    channels = 1 if info.dataset == "rot_mnist" else 3
    if transposed is None:
        transposed = info.dataset == "rot_mnist"  # as the paper's rot-MNIST checkpoints
    return {"input": dict(size=info.input_size, channels=channels, mean=[0.4] * channels, std=[0.3] * channels,
                          transposed=transposed)}


def calibrated(name: str, **overrides) -> models.Network:
    """Random weights, BatchNorm statistics from data (as tests/test_models.py), eval mode."""
    torch.manual_seed(0)
    model = models.build_model(name, **overrides)
    card = card_for(name)
    spec = card["input"]
    with torch.no_grad():
        for norm in (m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)):
            norm.reset_running_stats()
            norm.momentum = None
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
        images = torch.rand(4, spec["channels"], spec["size"], spec["size"], generator=torch.Generator().manual_seed(1))
        model.train()(InputFrame.from_card(card, model.group).to_network(images))
    return model.eval()


def random_image(name: str, seed: int = 0) -> np.ndarray:
    spec = card_for(name)["input"]
    rng = np.random.default_rng(seed)
    return rng.random((spec["channels"], spec["size"], spec["size"])).astype(np.float32)


@pytest.fixture(scope="module")
def analysed():
    """One analysis per case (element 1 applied first, so the identity is not special)."""
    out = {}
    for name, overrides in CASES.items():
        model = calibrated(name, **overrides)
        out[name] = (model, analyse(model, card_for(name), random_image(name), element=1))
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_maps_of_transformed_images_are_transformed_maps(analysed, name):
    model, result = analysed[name]
    layers = list(result.attention.values()) + list(result.features.values())
    assert layers and len(result.elements) == (model.group.order if model.group else 4)
    if not result.equivariant:
        # A planar CNN is not equivariant, and the proof says so.
        assert max(layer.relative_error.max() for layer in layers) > 1e-2
        return
    for layer in layers:
        assert layer.maps.shape == layer.expected.shape and layer.maps.shape[0] == len(result.elements)
        worst = layer.relative_error.max()
        assert worst <= MAP_TOLERANCE, f"{name} {layer.kind} {layer.name}: maps(g.x) != g.maps(x), {worst:.2e}"
        assert np.allclose(layer.max_abs_error, np.abs(layer.difference).reshape(len(layer.maps), -1).max(1))


@pytest.mark.parametrize("name", [n for n in CASES if n != "z2cnn"])
def test_predictions_are_invariant(analysed, name):
    _, result = analysed[name]
    assert result.probabilities.shape == (len(result.elements), len(result.class_names))
    assert np.allclose(result.probabilities.sum(1), 1)
    assert result.probability_error <= PROBABILITY_TOLERANCE


def test_attention_maps_are_effective_attention_in_unit_range(analysed):
    _, result = analysed["a_p4cnn"]
    for layer in result.attention.values():
        assert layer.maps.min() >= 0 and layer.maps.max() <= 1
        assert layer.maps.shape[1] == 4


def test_expected_side_is_the_identity_maps_moved_by_g(analysed):
    # The proof's right-hand side is built from un-reduced tensors; for features the reduction
    # commutes with g, so it must equal the reduced identity maps moved by g directly.
    model, result = analysed["fa_p4m_densenet"]
    for layer in result.features.values():
        for t, g in enumerate(result.elements):
            moved = model.group.act(torch.from_numpy(layer.maps[0]), g, (0,)).numpy()
            assert np.allclose(layer.expected[t], moved, atol=1e-6)


def test_batched_transforms_equal_separate_passes(analysed):
    model, result = analysed["a_p4cnn"]
    card = card_for("a_p4cnn")
    base = apply_element(random_image("a_p4cnn"), 1)
    assert np.array_equal(result.images[0], base)
    alone = analyse(model, card, apply_element(base, 3))
    assert np.allclose(alone.attention["c3"].maps[0], result.attention["c3"].maps[3], atol=1e-5)
    assert np.allclose(alone.probabilities[0], result.probabilities[3], atol=1e-6)


def test_transposed_models_show_maps_in_the_users_frame():
    model = calibrated("fa_p4cnn")
    image = random_image("fa_p4cnn")
    result = analyse(model, card_for("fa_p4cnn", transposed=True), image)
    # The network saw image.T, as it does for an untransposed card given image.T; what it computed
    # there comes back transposed, with orientation h shown at index t h t.
    plain = analyse(model, card_for("fa_p4cnn", transposed=False), np.ascontiguousarray(image.transpose(0, 2, 1)))
    conjugation = transpose_conjugation(model.group).numpy()
    for name in ("c2", "c5"):
        network_frame = plain.features[name].maps[0]  # (G, X, Y)
        assert np.allclose(result.features[name].maps[0], network_frame[conjugation].transpose(0, 2, 1), atol=1e-6)
        assert np.allclose(result.attention[name].maps[0],
                           plain.attention[name].maps[0][conjugation].transpose(0, 2, 1), atol=1e-6)
    # Without relabelling the orientation axis the proof would fail: rotations reverse under transposition.
    assert transpose_conjugation(models.P4).tolist() == [0, 3, 2, 1]
    assert transpose_conjugation(models.P4M).tolist() == [0, 3, 2, 1, 6, 5, 4, 7]
    assert max(layer.relative_error.max() for layer in result.features.values()) <= MAP_TOLERANCE


def test_full_attention_reduction_equals_mean_of_the_effective_map():
    model = calibrated("a_p4cnn")
    x = torch.randn(2, 1, 28, 28, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        _, trace = model.trace(x)
    parts = trace.attention["c2"]
    effective = parts.effective().double()  # (B, C_out, G, C_in, G_in, X, Y); kept maps are float64
    assert reduce_attention(parts).dtype == torch.float64
    assert torch.allclose(reduce_attention(parts), effective.mean(dim=(1, 3, 4)), atol=1e-6)
    chosen = reduce_attention(parts, MapSelection(channel=3, in_orientation=2))
    assert torch.allclose(chosen, effective[:, 3, :, :, 2].mean(dim=2), atol=1e-6)
    lifting = trace.attention["c1"]
    assert torch.allclose(reduce_attention(lifting), lifting.effective().double().mean(dim=(1, 3)), atol=1e-6)


def test_selected_channel_and_input_orientation_are_still_exact(analysed):
    model, _ = analysed["a_p4cnn"]
    chosen = {name: MapSelection(channel=4, in_orientation=1) for name in ("c2", "c3", "c7")}
    result = analyse(model, card_for("a_p4cnn"), random_image("a_p4cnn", seed=2), selections=chosen)
    assert "output channel 4" in result.attention["c2"].description
    assert result.attention["c2"].selection == chosen["c2"] and "mean" in result.attention["c1"].description
    assert (result.attention["c2"].channels, result.attention["c2"].in_orientations) == (10, 4)
    assert (result.attention["c1"].channels, result.attention["c1"].in_orientations) == (10, 0)
    assert max(layer.relative_error.max() for layer in result.attention.values()) <= MAP_TOLERANCE


def test_bad_selections_and_inputs_are_named(analysed):
    model, _ = analysed["a_p4cnn"]
    card, image = card_for("a_p4cnn"), random_image("a_p4cnn")
    with pytest.raises(ValueError, match=r"channel must be in \[0, 10\), got 10"):
        analyse(model, card, image, selections={"c3": MapSelection(channel=10)})
    fa_model, _ = analysed["fa_p4cnn"]
    with pytest.raises(ValueError, match="only for full group layers"):
        analyse(fa_model, card_for("fa_p4cnn"), image, selections={"c2": MapSelection(in_orientation=0)})
    with pytest.raises(ValueError, match=r"shape \(1, 28, 28\), got \(1, 32, 32\)"):
        analyse(model, card, np.zeros((1, 32, 32), np.float32))


def test_the_model_is_never_mutated():
    model = calibrated("fa_p4cnn")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    analyse(model, card_for("fa_p4cnn"), random_image("fa_p4cnn"))
    assert not model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="eval mode"):
        analyse(model.train(), card_for("fa_p4cnn"), random_image("fa_p4cnn"))


def test_arbitrary_angles_are_exact_only_at_quarter_turns(analysed):
    model, _ = analysed["fa_p4cnn"]
    card, image = card_for("fa_p4cnn"), random_image("fa_p4cnn")
    original = analyse(model, card, image)
    exact = angle_deviation(original, analyse(model, card, rotate_by_angle(image, 90)), 90)
    assert exact.exact and exact.quarter_turns == 1
    assert max(exact.layer_errors.values()) <= MAP_TOLERANCE and exact.probability_error <= PROBABILITY_TOLERANCE
    tilted = angle_deviation(original, analyse(model, card, rotate_by_angle(image, 30)), 30)
    assert not tilted.exact and tilted.quarter_turns == 0
    assert max(tilted.layer_errors.values()) > 1e-2
