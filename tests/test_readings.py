"""The readings of attention (kept alpha+, removed alpha-, spatial alpha_s) and the paper's composite picture."""

from pathlib import Path

import numpy as np
import pytest
import torch
from test_app_compute import calibrated, card_for, random_image
from test_reference_models import load

import models
from app.analysis.composite import paper_composite
from app.analysis.compute import analyse
from app.analysis.frames import InputFrame
from app.analysis.images import fit_to_model, read_image
from app.analysis.nuclei import nuclei_statistics
from app.analysis.reductions import MapSelection, describe_reduction, reduce_attention, reduce_readings, upsample
from models.attention.parts import READINGS, AttentionParts

PATCH = "app/gallery/pcam_tumour_0a5f22f6a5.jpg"
SHIPPED_PCAM = "checkpoints/fa_p4m_densenet_pcam.safetensors"


def every_layer(analysis, reading):
    return {name: MapSelection(reading=reading) for name in analysis.attention}


@pytest.fixture(scope="module")
def pcam():
    """The shipped H&E model's analyses of one gallery patch in every reading (one forward pass each)."""
    model, card = models.load_checkpoint(SHIPPED_PCAM)
    model.eval()
    image = fit_to_model(read_image(Path(PATCH).read_bytes()), 96, 3).pixels
    kept = analyse(model, card, image)
    return image, {reading: analyse(model, card, image, 0, every_layer(kept, reading)) for reading in READINGS}


def test_the_apps_removed_maps_are_one_minus_its_kept_maps(pcam):
    _, by_reading = pcam
    for name in by_reading["kept"].attention:
        kept, removed = by_reading["kept"].attention[name], by_reading["removed"].attention[name]
        # Kept maps are float64 (1 - alpha- in float32 would keep three digits of an alpha- near 1e-4, as in
        # block_layers.0.conv), the others float32 like the forward pass: their sum is 1 to float32's round-off.
        assert kept.maps.dtype == np.float64 and removed.maps.dtype == np.float32, name
        np.testing.assert_allclose(kept.maps + removed.maps, 1.0, atol=1e-6)
        assert np.abs(kept.maps - kept.expected).max() <= 1e-5, name  # the proof: the float32 pass's round-off


def test_float64_readings_give_exactly_opposite_ranks_at_every_layer():
    """:func:`reduce_readings` (what the Fig. 5 measurement uses): kept = 1 - removed in float64, so the per-patch
    rank correlations with haematoxylin are negatives, but for ties: where alpha- is 1e-4 or less (the shipped
    model's second and third attention layers), 1 - alpha- rounds distinct values of alpha- to one float64, and
    those tied ranks move the correlation by up to about 1e-6."""
    model, card = models.load_checkpoint(SHIPPED_PCAM)
    model.eval()
    image = fit_to_model(read_image(Path(PATCH).read_bytes()), 96, 3).pixels
    frame = InputFrame.from_card(card, model.group)
    with torch.no_grad():
        _, trace = model.trace(frame.to_network(torch.from_numpy(image[None])))
    for index, (name, parts) in enumerate(trace.attention.items()):
        readings = reduce_readings(frame.attention_to_user(parts))
        removed = upsample(readings["removed"], 96).mean(dim=1)[0].numpy()
        spatial = upsample(readings["spatial"], 96).mean(dim=1)[0].numpy()
        rho = {reading: nuclei_statistics(image, values, name).spearman
               for reading, values in (("kept", 1 - removed), ("removed", removed), ("spatial", spatial))}
        assert rho["kept"] == pytest.approx(-rho["removed"], abs=1e-5), name
        if index == 0:  # the lifting layer: alpha_s is alpha- divided by one positive number
            assert rho["spatial"] == pytest.approx(rho["removed"], abs=1e-12)


def test_every_reading_and_the_composite_move_with_the_image_over_p4m(pcam):
    _, by_reading = pcam
    for reading, analysis in by_reading.items():
        for name, layer in analysis.attention.items():
            assert layer.relative_error.max() <= 1e-5, (reading, name)
    composite = by_reading["kept"].composite
    assert composite.maps.shape == (8, 8, 96, 96)
    assert composite.relative_error.max() <= 1e-5


def test_the_composite_equals_the_papers_own_product_map():
    """``vis_product_map_rot`` of the reference: their disabled visualisation code's ``map_0`` (fA_P4CNN)."""
    model, ref = load("fa_p4cnn")
    x = torch.from_numpy(ref["inputs"])
    with torch.no_grad():
        for k in range(4):
            _, trace = model.trace(torch.rot90(x, k, dims=(-2, -1)))
            composite = paper_composite(trace.attention, 28, 4)
            expected = torch.from_numpy(ref["vis_product_map_rot"][k][:, 0]).double()
            assert (composite - expected).abs().max().item() <= 1e-6


@pytest.mark.parametrize("name", ["a_p4cnn", "asp_p4cnn", "arh_p4cnn"])
def test_spatial_and_removed_readings_of_other_layouts_are_exact_under_the_group(name):
    model = calibrated(name)
    card = card_for(name)
    image = random_image(name)
    kept = analyse(model, card, image)
    for reading in ("removed", "spatial"):
        analysis = analyse(model, card, image, 0, every_layer(kept, reading))
        for layer_name, layer in analysis.attention.items():
            assert layer.relative_error.max() <= 1e-4, (reading, layer_name)
            assert 0.0 <= layer.maps.min() and layer.maps.max() <= 1.0
    assert analysis.composite is not None and analysis.composite.relative_error.max() <= 1e-4


def test_a_channel_only_layer_has_no_spatial_reading_and_no_composite():
    model = calibrated("ach_p4cnn")
    image = random_image("ach_p4cnn")
    kept = analyse(model, card_for("ach_p4cnn"), image)
    assert kept.composite is None
    with pytest.raises(ValueError, match="no spatial attention"):
        analyse(model, card_for("ach_p4cnn"), image, 0, every_layer(kept, "spatial"))


def test_unknown_reading_is_refused_and_each_reading_describes_itself():
    with pytest.raises(ValueError, match="unknown reading 'alpha'"):
        MapSelection(reading="alpha")
    parts = AttentionParts(torch.full((1, 3, 1, 1), 0.5), torch.rand(1, 1, 8, 8))
    with pytest.raises(ValueError, match="unknown reading"):
        parts.reading("alpha")
    texts = {reading: describe_reduction("input_lifting", MapSelection(reading=reading)) for reading in READINGS}
    assert "what the layer keeps" in texts["kept"]
    assert "subtracts" in texts["removed"]
    assert "paper's figures" in texts["spatial"]
    torch.testing.assert_close(reduce_attention(parts, MapSelection(reading="spatial")), parts.spatial)
    torch.testing.assert_close(reduce_attention(parts, MapSelection(reading="removed")), 0.5 * parts.spatial)
