"""The patch page's readings of attention (alpha+, alpha-, alpha_s, the paper's composite) and its nuclei outlines:
the pure pieces, then the page in AppTest on small random-weight checkpoints."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_app_ui import app, chart, ok, open_tab, select_model, viewer, write_dev_checkpoints
from test_app_variants import heatmaps

import models
from app.analysis.compute import analyse
from app.analysis.images import fit_to_model, read_image
from app.analysis.nuclei import PatchStains
from app.analysis.pathology import nuclei_masks
from app.analysis.readings import (
    BRIGHT,
    COLOUR_TITLES,
    LABELS,
    PAGE_READINGS,
    PageReadings,
    composite_sum,
    layer_selections,
    page_readings,
)
from app.analysis.transforms import apply_element
from app.gallery import list_patches
from app.pictures.encode import decode_data_url

PATCH = next(item for item in list_patches() if item.kind == "he")
FIG5_CAPTION = "Fig. 5 as the paper lays it out"
ARCHS = ["a_p4cnn", "ach_p4cnn", "p4cnn", "fa_p4m_densenet"]


def test_each_model_offers_the_readings_its_layers_have():
    spatial = page_readings(models.build_model("fa_p4cnn"))
    assert spatial.options == PAGE_READINGS and spatial.default == "spatial" and not spatial.missing
    channel_only = page_readings(models.build_model("ach_p4cnn"))
    assert channel_only.options == ("kept", "removed") and channel_only.default == "kept"
    assert "channel-only" in channel_only.missing and "no spatial attention" in channel_only.missing
    assert page_readings(models.build_model("p4cnn")).options == ()


def test_every_layer_carries_the_reading_and_the_composite_shows_its_factors():
    readings = PageReadings(PAGE_READINGS, "spatial", "", {"c1": True, "c2": False})
    assert {n: s.reading for n, s in layer_selections(readings, "kept").items()} == {"c1": "kept", "c2": "kept"}
    # alpha_s does not exist where a layer has no spatial attention: that layer shows what it removes.
    assert {n: s.reading for n, s in layer_selections(readings, "spatial").items()} == {"c1": "spatial",
                                                                                         "c2": "removed"}
    assert layer_selections(readings, "composite")["c1"].reading == "spatial"


def patch_pixels(item=PATCH) -> np.ndarray:
    return fit_to_model(read_image(item.path.read_bytes()), 96, 3).pixels


def test_nuclei_masks_move_with_the_image_and_find_nuclei():
    image = patch_pixels()
    moved = np.stack([apply_element(image, g) for g in range(8)])  # (8, 3, 96, 96)
    masks = nuclei_masks(moved)
    assert masks.dtype == bool and masks.shape == (8, 96, 96)
    assert 0.01 < masks[0].mean() < 0.6, "a tumour patch has nuclei, and not only nuclei"
    for g in range(8):
        np.testing.assert_array_equal(masks[g], apply_element(masks[0], g), err_msg=f"element {g}")


def test_the_outline_and_the_measurement_see_the_same_nuclei():
    # A resized patch's values lie between the 256 levels: both convert them alike (app.analysis.pathology.rgb_255).
    image = patch_pixels()
    resized = torch.nn.functional.interpolate(torch.from_numpy(image)[None], size=(90, 90), mode="bilinear",
                                              antialias=True)[0].clamp(0, 1).numpy()
    assert not np.allclose(resized * 255, np.round(resized * 255), atol=1e-3)
    np.testing.assert_array_equal(nuclei_masks(resized[None])[0], PatchStains.of(resized).nuclei)


def test_the_composite_sum_over_orientations_keeps_its_proof():
    model = models.build_model("fa_p4cnn").eval()
    card = {"input": dict(size=28, channels=1, mean=[0.1], std=[0.3], transposed=False)}
    analysis = analyse(model, card, np.random.default_rng(0).random((1, 28, 28)).astype(np.float32))
    summed = composite_sum(analysis.composite)
    np.testing.assert_allclose(summed.maps[:, 0], analysis.composite.maps.sum(axis=1), rtol=1e-5)
    assert summed.relative_error.max() <= 1e-5
    for t in range(4):  # the sum forgets the orientation axis: g.x's picture is x's turned by g
        np.testing.assert_allclose(summed.maps[t, 0], np.rot90(summed.maps[0, 0], t), rtol=1e-4, atol=1e-12)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("checkpoints")
    write_dev_checkpoints(path, ARCHS)
    return path


def reading_box(at):
    return next(w for w in at.selectbox if (w.key or "").startswith("reading-"))


def read(at, reading: str):
    """The page in ``reading``: its maps' values and colour bar title, and its captions. The composite is one
    figure of every transform; a layer's maps are the viewer's, 8-bit positions in its colour range."""
    at = ok(reading_box(at).set_value(reading).run())
    captions = " ".join(c.value for c in at.caption)
    if reading == "composite":
        spec = json.loads(chart(at, "maps").proto.spec)
        return at, heatmaps(spec), spec["layout"]["coloraxis"]["colorbar"]["title"]["text"], captions
    shown = viewer(at)
    low, high = shown["low"], shown["high"]
    maps = [low + decode_data_url(url) / 255.0 * (high - low) for url in shown["maps"][0]]
    return at, maps, shown["colourTitle"], captions


def test_the_reading_control_changes_maps_captions_and_legend(folder, monkeypatch):
    at = select_model(app(monkeypatch, folder), "a_p4cnn")
    box = reading_box(at)
    assert box.options == [LABELS[r] for r in PAGE_READINGS] and box.value == "spatial", "the paper's reading first"
    assert BRIGHT["spatial"] in " ".join(c.value for c in at.caption)
    assert "The page starts on α_s, the paper's reading" in " ".join(c.value for c in at.caption), "and says why"
    at = ok(at.sidebar.radio(key="range_mode-other").set_value("full").run())  # the values themselves
    seen = {}
    for reading in ("kept", "removed", "spatial"):
        at, maps, title, captions = read(at, reading)
        assert title == COLOUR_TITLES[reading] and BRIGHT[reading] in captions, reading
        assert len(maps) == 4, "one panel per p4 orientation"
        seen[reading] = np.stack(maps)
    np.testing.assert_allclose(seen["kept"] + seen["removed"], 1.0, atol=1 / 255 + 1e-9)  # one 8-bit step
    # a_p4cnn's full attention: alpha- = alpha_c * alpha_s averaged, not alpha_s itself.
    assert np.abs(seen["spatial"] - seen["removed"]).max() > 1e-3
    # The arrow field's attention layers follow the reading too.
    arrows = next(w for w in at.selectbox if w.label == "Arrow field of")
    at = ok(arrows.set_value("attention/c2").run())
    assert "The maps are α_s per orientation." in " ".join(c.value for c in at.caption)


def test_the_composite_shows_one_picture_per_transform_with_its_proof(folder, monkeypatch):
    at = select_model(app(monkeypatch, folder), "a_p4cnn")
    at = ok(at.sidebar.radio(key="range_mode-other").set_value("full").run())
    at, maps, title, captions = read(at, "composite")
    assert BRIGHT["composite"] in captions and title == COLOUR_TITLES["composite"]
    spec = json.loads(chart(at, "maps").proto.spec)
    assert [a["text"] for a in spec["layout"]["annotations"]][:4] == ["rot 0°", "rot 90°", "rot 180°", "rot 270°"]
    for t in range(4):  # each panel is the picture of g.x: the picture of x turned by g
        np.testing.assert_allclose(maps[t], np.rot90(maps[0], t), rtol=1e-4, atol=1e-4 * maps[0].max())
    assert next(w for w in at.selectbox if w.label == "Arrow field of").value == "composite"
    assert "The maps are the composite ∏ α_s per orientation." in " ".join(c.value for c in at.caption)
    at = open_tab(at, "Equivariance proof")
    proof = {m.label: float(m.value) for m in at.metric if m.label.startswith("relative")}
    assert any("composite" in m.label for m in at.metric) and max(proof.values()) < 1e-4
    at = open_tab(at, "Export")
    assert FIG5_CAPTION in " ".join(c.value for c in at.caption), "Fig. 5 is offered where a composite exists"


def test_nuclei_outlines_only_for_rgb_models_and_follow_every_transform(folder, monkeypatch):
    at = select_model(app(monkeypatch, folder), "fa_p4m_densenet")
    shown = next(item for item in list_patches() if item.name == at.sidebar.selectbox[1].value)
    assert viewer(at)["outlines"] is None
    at = ok(at.sidebar.checkbox(key="outline_nuclei").check().run())
    expected = nuclei_masks(patch_pixels(shown)[None])[0]
    # The viewer outlines them on every orientation's panel, moved with the image by each turn in the browser.
    np.testing.assert_array_equal(decode_data_url(viewer(at)["outlines"]), expected.astype(np.uint8) * 255)
    assert "White outlines: the nuclei" in " ".join(c.value for c in at.caption)
    at, *_ = read(at, "composite")
    contours = [c for c in json.loads(chart(at, "maps").proto.spec)["data"] if c["type"] == "contour"]
    outlines = heatmaps({"data": [dict(c, type="heatmap") for c in contours]})
    for g, z in enumerate(outlines):  # each transform's panel outlines its own image's nuclei
        np.testing.assert_array_equal(z, apply_element(expected, g), err_msg=f"element {g}")
    at = select_model(at, "a_p4cnn")
    assert not [c for c in at.sidebar.checkbox if c.key == "outline_nuclei"], "grey digits have no nuclei"


def test_models_without_alpha_s_say_why(folder, monkeypatch):
    at = select_model(app(monkeypatch, folder), "ach_p4cnn")
    box = reading_box(at)
    assert box.options == [LABELS["kept"], LABELS["removed"]] and box.value == "kept"
    captions = " ".join(c.value for c in at.caption)
    assert "channel-only" in captions and "no spatial attention map α_s" in captions
    assert BRIGHT["kept"] in captions
    assert FIG5_CAPTION not in captions, "no alpha_s, no composite, no Fig. 5"
    at = select_model(at, "p4cnn")
    assert not [w for w in at.selectbox if (w.key or "").startswith("reading-")], "no attention, nothing to read"

