"""Arrow fields (exactly equivariant, shared scale), PNG renderings and the NPZ export round trip."""

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image
from test_app_compute import calibrated, card_for, random_image

from app.analysis.compute import analyse
from app.analysis.reductions import MapSelection, upsample
from app.pictures.arrows import MIN_LENGTH, arrow_field
from app.pictures.export import export_npz, read_npz
from app.pictures.figures import render_arrow_field_png, render_map_png


@pytest.fixture(scope="module")
def p4m_result():
    model = calibrated("fa_p4m_densenet")
    return model, analyse(model, card_for("fa_p4m_densenet"), random_image("fa_p4m_densenet"))


@pytest.fixture(scope="module")
def p4_result():
    model = calibrated("a_p4cnn")
    selections = {"c3": MapSelection(channel=1, in_orientation=3)}
    return model, analyse(model, card_for("a_p4cnn"), random_image("a_p4cnn"), selections=selections)


@pytest.mark.parametrize("mode,border", [("selectivity", 0), ("dominant", 0), ("response", 0), ("selectivity", 13)])
@pytest.mark.parametrize("fixture,layer", [("p4m_result", "block_layers.1.conv"), ("p4_result", "c2")])
def test_arrow_field_moves_with_the_image(request, fixture, layer, mode, border):
    model, result = request.getfixturevalue(fixture)
    for kind in ("features", "attention"):
        field = arrow_field(getattr(result, kind)[layer], image_size=result.images.shape[-1], mode=mode,
                            border=border if result.images.shape[-1] > 28 else 0)
        cells = int(round(np.sqrt(len(field.positions))))
        grid = field.lengths.reshape(len(result.elements), field.orientation_ids.size, cells, cells)
        assert grid.max() == pytest.approx(1.0) and grid.min() >= 0
        # The arrows move with the image as exactly as the maps do: their proof error, in units of the arrow
        # scale (selectivity is a difference of responses, so its relative round-off is the maps' magnified);
        # an arrow at the drawing threshold may be drawn on one side and not on the other.
        maps = getattr(result, kind)[layer]
        tolerance = 4 * float(maps.max_abs_error.max()) / field.scale + 1e-6
        for t, g in enumerate(result.elements):
            moved = model.group.act(torch.from_numpy(grid[0]), g, (0,)).numpy()
            at_threshold = (np.minimum(grid[t], moved) == 0) & (np.maximum(grid[t], moved) < MIN_LENGTH + tolerance)
            error = np.where(at_threshold, 0.0, np.abs(grid[t] - moved)).max()
            assert error <= tolerance, f"{kind} arrows of {layer} under {result.element_names[t]}: {error}"
            assert tolerance < 1e-3
        # The grid of positions is centred: symmetric about the image centre.
        centre = (result.images.shape[-1] - 1) / 2
        assert np.allclose(np.sort(field.positions[:, 0]), np.sort(2 * centre - field.positions[:, 0]))


def test_arrow_field_metadata(p4m_result):
    _, result = p4m_result
    field = arrow_field(result.features["c1"], 96, spacing=10, scale=2.0)
    assert field.spacing == 10 and field.scale == 2.0
    assert field.positions.shape == (81, 2) and field.lengths.shape == (8, 8, 81)  # 9 x 9 cells, centred
    assert field.mirrored.tolist() == [False] * 4 + [True] * 4
    assert np.allclose(np.linalg.norm(field.directions, axis=1), 1)
    with pytest.raises(ValueError, match="no orientation axis"):
        arrow_field(result.attention["c1"], 96)  # alpha_F on the image: one invariant map


def decode(png: bytes) -> Image.Image:
    img = Image.open(io.BytesIO(png))
    img.load()
    return img


def test_png_renderings_decode(p4m_result):
    _, result = p4m_result
    layer = result.attention["block_layers.0.conv"]
    overlay = layer.upsampled(96)  # (T, H, 96, 96)
    assert np.allclose(overlay, upsample(torch.from_numpy(layer.maps), 96).numpy())
    assert layer.upsampled(96, "difference").shape == (8, 8, 96, 96)
    for png in (render_map_png(overlay[1, 2], result.images[1], title="rot 90°, h = 2"),
                render_map_png(layer.difference[1, 2], cmap="RdBu", vmin=-1e-6, vmax=1e-6),
                render_arrow_field_png(arrow_field(result.features["c1"], 96), 5, result.images[5], title="flip")):
        img = decode(png)
        assert img.format == "PNG" and min(img.size) > 200
        assert np.asarray(img.convert("L")).std() > 5  # not blank


def test_npz_round_trip(p4_result):
    _, result = p4_result
    field = arrow_field(result.features["c4"], 28, spacing=4)
    data = export_npz(result, field=field, field_layer="c4", extra={"model": "a_p4cnn", "image": "random"})
    arrays, metadata = read_npz(data)
    assert np.array_equal(arrays["images"], result.images)
    assert np.array_equal(arrays["probabilities"], result.probabilities)
    assert arrays["elements"].tolist() == list(result.elements)
    for kind in ("attention", "features"):
        for name, layer in getattr(result, kind).items():
            for part in ("maps", "expected", "max_abs_error", "relative_error"):
                assert np.array_equal(arrays[f"{kind}/{name}/{part}"], getattr(layer, part)), f"{kind}/{name}/{part}"
            described = metadata["layers"][f"{kind}/{name}"]
            assert described["shape"] == list(layer.maps.shape) and described["layout"] == layer.layout
    for part in ("positions", "directions", "lengths", "orientation_ids", "mirrored"):
        assert np.array_equal(arrays[f"arrows/{part}"], getattr(field, part))
    assert metadata["layers"]["attention/c3"]["selection"] == {"channel": 1, "in_orientation": 3, "reading": "kept"}
    assert metadata["arrows"] == {"layer": "c4", "scale": field.scale, "spacing": 4, "image_size": 28}
    assert metadata["element_names"] == list(result.element_names) and metadata["group"] == "p4"
    assert metadata["extra"] == {"model": "a_p4cnn", "image": "random"}
    # Plain numpy reads it without unpickling.
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        assert json.loads(str(npz["metadata"]))["class_names"] == list(result.class_names)


def test_npz_of_chosen_layers(p4_result):
    _, result = p4_result
    arrays, metadata = read_npz(export_npz(result, layers=["c2"]))
    assert {key.split("/")[1] for key in arrays if "/" in key} == {"c2"}
    assert metadata["arrows"] is None and set(metadata["layers"]) == {"attention/c2", "features/c2"}
