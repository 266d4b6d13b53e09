"""What makes the pictures read: arrows only where orientations differ, colour ranges from the maps themselves,
overlays that keep the image visible, and the padding border measured and kept out of both."""

import numpy as np
import pytest
from test_app_compute import calibrated, card_for

from app.analysis.compute import LayerMaps, analyse
from app.analysis.padding import border_left_out, constant_images, layer_border, padding_borders
from app.pictures.arrows import ARROW_MODES, MIN_LENGTH, arrow_field, cell_lengths
from app.pictures.map_style import colour_range, display_maps, inside, overlay
from app.pictures.plots import map_panels


def stroke_on_empty_right_half() -> np.ndarray:
    """A 28 x 28 digit-like image: an L-shaped stroke in the left half, the right 12 columns exactly 0."""
    image = np.zeros((1, 28, 28), dtype=np.float32)
    image[0, 6:22, 5:8] = 1.0
    image[0, 19:22, 5:14] = 1.0
    return image


@pytest.fixture(scope="module")
def stroke_analysis():
    model = calibrated("a_p4cnn")
    return analyse(model, card_for("a_p4cnn"), stroke_on_empty_right_half())


def constants(model, card):
    return [analyse(model, card, image) for image in constant_images(card)]


@pytest.mark.parametrize("mode", ["selectivity", "dominant"])
def test_a_region_of_constant_image_gets_no_arrows(stroke_analysis, mode):
    model, card = calibrated("a_p4cnn"), card_for("a_p4cnn")
    border = padding_borders(constants(model, card))["features/c1"]
    assert 0 < border < 8  # a_p4cnn's c1 attends with a padded 7x7 spatial filter
    field = arrow_field(stroke_analysis.features["c1"], 28, spacing=4, mode=mode, border=border)
    # The stroke ends at column 13; c1's features reach 3 + 3 pixels (3x3 filter, 7x7 attention): cells centred
    # at column 21 or beyond see only the constant 0 (or the padding border, which is left out).
    empty = field.positions[:, 1] >= 21
    assert empty.sum() >= 7
    assert (field.lengths[0][:, empty] == 0).all(), "arrows drawn over a constant region"  # x itself, t = 0
    assert (field.lengths[0][:, ~empty] > 0).any(), "no arrows on the stroke"


def test_raw_responses_put_arrows_everywhere_that_selectivity_leaves_empty(stroke_analysis):
    response = arrow_field(stroke_analysis.features["c1"], 28, spacing=4, mode="response")
    empty = response.positions[:, 1] >= 21
    # The constant background responds (batch-norm-free features of a zero image are not zero), but equally
    # in every orientation: the old drawing showed full-length arrows there.
    assert (response.lengths[0][:, empty] > 0).all()


def test_cell_lengths_by_mode():
    # (T=1, H=3, P=3): cells 1 and 2 are background (each orientation at its median level, though orientation 0
    # sits lower there, as a global channel weight would make it); cell 0 prefers orientation 1.
    strength = np.array([[[1.0, 0.5, 0.5], [3.0, 2.0, 2.0], [2.0, 2.0, 2.0]]])
    np.testing.assert_array_equal(cell_lengths(strength, "response"), strength)
    # Above background: (0.5, 1, 0) at cell 0, nothing elsewhere.
    np.testing.assert_array_equal(cell_lengths(strength, "selectivity"), [[[0.5, 0, 0], [1.0, 0, 0], [0.0, 0, 0]]])
    # Dominant: orientation 1 leads by 0.5 at cell 0; the background cells tie, so no arrow whoever "wins".
    np.testing.assert_array_equal(cell_lengths(strength, "dominant"), [[[0.0, 0, 0], [0.5, 0, 0], [0.0, 0, 0]]])
    with pytest.raises(ValueError, match="unknown arrow mode 'loud'"):
        cell_lengths(strength, "loud")
    assert set(ARROW_MODES) == {"selectivity", "dominant", "response"}


def test_short_arrows_and_the_padding_border_are_left_out(stroke_analysis):
    layer = stroke_analysis.features["c2"]
    field = arrow_field(layer, 28, spacing=4)
    drawn = field.lengths[field.lengths > 0]
    assert drawn.min() >= MIN_LENGTH and drawn.max() == pytest.approx(1.0)
    bordered = arrow_field(layer, 28, spacing=4, border=6)
    edge = np.minimum(field.positions, 27 - field.positions).min(axis=1) < 6
    assert (bordered.lengths[:, :, edge] == 0).all() and (bordered.lengths[:, :, ~edge] > 0).any()


def synthetic_layer(maps: np.ndarray, kind: str = "attention") -> LayerMaps:
    errors = np.zeros(len(maps))
    return LayerMaps(name="x", kind=kind, layout="test", description="", maps=maps, expected=maps,
                     max_abs_error=errors, relative_error=errors)


def test_the_colour_range_comes_from_the_map():
    rng = np.random.default_rng(0)
    maps = rng.uniform(0.4, 0.6, size=(4, 4, 28, 28)).astype(np.float32)
    low, high = colour_range(maps, "robust")
    assert 0.4 < low < 0.41 and 0.59 < high < 0.6
    assert colour_range(2 * maps, "robust") == pytest.approx((2 * low, 2 * high), rel=1e-6)
    assert colour_range(maps + 0.3, "robust") == pytest.approx((low + 0.3, high + 0.3), rel=1e-6)
    assert colour_range(maps, "full") == (0.0, 1.0)  # attention's own scale, whatever the map
    # An extreme frame (the padding border) does not move the range once it is left out.
    framed = maps.copy()
    framed[..., :3, :] = 1.0
    assert colour_range(framed, "robust")[1] == 1.0
    assert colour_range(framed, "robust", border=3) == pytest.approx((low, high), abs=2e-3)


def test_deviation_and_equalised_values():
    rng = np.random.default_rng(1)
    maps = (0.99 + 0.01 * rng.random((2, 4, 16, 16)) ** 3).astype(np.float32)  # crowded near 0.99: a "wash"
    layer = synthetic_layer(maps)
    deviation = display_maps(layer, 16, "deviation")
    np.testing.assert_allclose(deviation.mean(axis=1), 0, atol=1e-6)
    low, high = colour_range(deviation, "deviation")
    assert low == -high and high > 0
    equalised = display_maps(layer, 16, "equalised")
    assert colour_range(equalised, "equalised") == (0.0, 1.0)
    # Equalised, each tenth of the colour scale holds about a tenth of the pixels.
    shares = np.histogram(equalised, bins=10, range=(0, 1))[0] / equalised.size
    assert np.abs(shares - 0.1).max() < 0.02
    # The quantile table is the layer's (every transform and orientation): the order of values is kept.
    order = np.argsort(maps.ravel(), kind="stable")
    assert (np.diff(equalised.ravel()[order]) >= -1e-7).all()


def test_inside_leaves_the_border_out():
    values = np.arange(36.0).reshape(6, 6)
    assert inside(values, 2).tolist() == [[14.0, 15.0], [20.0, 21.0]]
    assert inside(values, 3) is values  # nothing would be left: everything counts


def test_overlay_keeps_the_image_where_the_map_is_low_and_colours_it_where_high():
    image = np.full((4, 4, 3), 200, dtype=np.uint8)
    image[0, 0] = (20, 40, 60)
    values = np.zeros((4, 4))
    values[2:, :] = 1.0
    out = overlay(image, values, 0.0, 1.0, "viridis", opacity=0.8)
    assert (out[:2] == image[:2]).all(), "a low value must leave the image as it is"
    assert not (out[2:] == image[2:]).all(axis=-1).any(), "a high value must colour the pixel"
    signed = overlay(image, values - 0.5, -0.5, 0.5, "RdBu_r", opacity=0.8, signed=True)
    assert not (signed == image).all(axis=-1).any(), "both ends of a deviation are coloured"
    middle = overlay(image, np.zeros((4, 4)), -0.5, 0.5, "RdBu_r", opacity=0.8, signed=True)
    assert (middle == image).all(), "no deviation, no colour"


def test_map_panels_side_by_side_puts_the_image_first_in_every_row():
    image = np.random.default_rng(2).random((3, 16, 16)).astype(np.float32)
    maps = np.random.default_rng(3).random((8, 16, 16)).astype(np.float32)
    titles = [f"h{i}" for i in range(8)]
    side = map_panels(image, maps, titles, style="side", border=3)
    kinds = [trace.type for trace in side.data]
    assert kinds.count("image") == 2 and kinds.count("heatmap") == 8  # one image per row of four maps
    assert [trace.xaxis for trace in side.data if trace.type == "image"] == ["x", "x6"]
    assert sum(shape.line.dash == "dot" for shape in side.layout.shapes) == 8  # the border on every map
    over = map_panels(image, maps, titles)
    assert [trace.type for trace in over.data].count("image") == 8
    assert all(trace.opacity == 0 for trace in over.data if trace.type == "heatmap")  # hover values only
    with pytest.raises(ValueError, match="style must be"):
        map_panels(image, maps, titles, style="mosaic")


def test_padding_border_is_measured_on_constant_images():
    # P4CNN: valid convolutions and no attention: nothing is padded, every layer's border is 0.
    p4cnn, card = calibrated("p4cnn"), card_for("p4cnn")
    assert set(padding_borders(constants(p4cnn, card)).values()) == {0}
    # The DenseNet pads every convolution: its deeper layers reach further in, up to the whole map.
    model, card = calibrated("fa_p4m_densenet"), card_for("fa_p4m_densenet")
    analyses = constants(model, card)
    borders = padding_borders(analyses)
    assert borders["features/c1"] > 0
    assert borders["features/block_layers.1.conv"] >= borders["features/block_layers.0.conv"]
    assert max(borders.values()) <= 48
    # Inside its border a constant image's map is constant; one pixel further out it is not, for some level.
    name = "block_layers.0.conv"
    b = borders[f"features/{name}"]
    assert b == max(layer_border(a.features[name], 96) for a in analyses)
    for analysis in analyses:
        maps = analysis.features[name].upsampled(96)[0]
        core = maps[:, b:96 - b, b:96 - b]
        assert np.ptp(core, axis=(1, 2)).max() <= 1e-4 * np.abs(maps).max()
    widest = max(analyses, key=lambda a: layer_border(a.features[name], 96)).features[name].upsampled(96)[0]
    ring = widest[:, b - 1:97 - b, b - 1:97 - b]
    assert np.ptp(ring, axis=(1, 2)).max() > 1e-4 * np.abs(widest).max()
    assert [float(image.mean()) for image in constant_images(card)][:3] == pytest.approx([0.0, 0.5, 1.0])


def test_a_border_that_would_leave_too_little_is_not_left_out(stroke_analysis):
    # fa_p4cnn's padding reaches 13 px into a 28-pixel digit: leaving that out would keep 2 x 2 pixels and one
    # cell of arrows, so every position counts instead; 9 px leaves 10 (over a third of 28) and is left out.
    assert border_left_out(13, 28) == 0 and border_left_out(14, 28) == 0 and border_left_out(0, 28) == 0
    assert border_left_out(9, 28) == 9 and border_left_out(32, 96) == 32 and border_left_out(33, 96) == 0
    values = np.arange(28.0 * 28).reshape(28, 28)
    assert inside(values, 13) is values and inside(values, 9).shape == (10, 10)
    layer = stroke_analysis.features["c2"]
    everywhere = arrow_field(layer, 28, spacing=4)
    np.testing.assert_array_equal(arrow_field(layer, 28, spacing=4, border=13).lengths, everywhere.lengths)
    kept = arrow_field(layer, 28, spacing=4, border=9)
    deep = np.minimum(kept.positions, 27 - kept.positions).min(axis=1) >= 9
    assert deep.sum() == 9 and (kept.lengths[:, :, ~deep] == 0).all()  # 3 x 3 cells keep their arrows
    image = np.zeros((1, 28, 28), dtype=np.float32)
    maps = np.random.default_rng(4).random((4, 28, 28)).astype(np.float32)
    outlined = [sum(shape.line.dash == "dot" for shape in map_panels(image, maps, list("abcd"), border=b).layout.shapes)
                for b in (9, 13)]
    assert outlined == [4, 0]
