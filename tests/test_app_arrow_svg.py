"""The page's arrow field as SVG (:mod:`app.pictures.arrow_svg`): the arrows of :func:`arrow_polygons`, to the
hundredth of a pixel, one path per orientation, over the mosaic's background pixel for pixel."""

from __future__ import annotations

import base64
import io
import re
import xml.etree.ElementTree as ET

import numpy as np
from PIL import Image

from app.pictures.arrow_svg import arrow_panels_svg
from app.pictures.arrows import ArrowField, PanelMosaic, arrow_polygons
from app.pictures.figures import ORIENTATION_COLOURS

RNG = np.random.default_rng(5)
IMAGES = RNG.random((8, 3, 24, 24), dtype=np.float32)
TITLES = [f"g{t}" for t in range(7)] + ["m <r>"]
SVG = "{http://www.w3.org/2000/svg}"


def made_up_field() -> ArrowField:
    positions = np.stack(np.meshgrid(np.arange(2, 24, 4), np.arange(2, 24, 4), indexing="ij"), -1).reshape(-1, 2)
    angles = np.arange(8) * np.pi / 4
    lengths = RNG.random((8, 8, len(positions)))
    lengths[lengths < 0.3] = 0  # arrows left out, as below MIN_LENGTH
    lengths[:, 2] = 0  # an orientation without any arrow: no path for it
    return ArrowField(positions=positions.astype(float), directions=np.stack([np.sin(angles), np.cos(angles)], 1),
                      lengths=lengths, orientation_ids=np.arange(8), mirrored=np.arange(8) >= 4, scale=1.0,
                      spacing=4, image_size=24)


def polygons_of(path: str) -> np.ndarray:
    """``(N, 7, 2)`` absolute vertices of an SVG path of ``M x y l dx dy ... z`` shapes."""
    shapes = []
    for shape in re.findall(r"M([^z]+)z", path):
        start, steps = shape.split("l")
        first = np.array(start.split(), dtype=float)
        moves = np.array(steps.split(), dtype=float).reshape(-1, 2)
        shapes.append(np.concatenate([first[None], first + np.cumsum(moves, axis=0)]))
    return np.array(shapes)


def test_every_arrow_is_drawn_where_arrow_polygons_puts_it():
    field = made_up_field()
    root = ET.fromstring(arrow_panels_svg(field, IMAGES, TITLES))
    mosaic = PanelMosaic(8, 24)
    paths = root.findall(f"{SVG}path")
    drawn = [h for h in range(8) if (field.lengths[:, h] > 0).any()]
    assert len(paths) == len(drawn) == 7
    for h, path in zip(drawn, paths, strict=True):
        expected = np.concatenate([arrow_polygons(field, t, h, origin) for t, origin in enumerate(mosaic.origins)])
        found = polygons_of(path.get("d"))
        assert found.shape == (int((field.lengths[:, h] > 0).sum()), 7, 2)
        assert np.abs(found - expected[:, :7]).max() <= 0.011, f"orientation {h}"  # two decimals, two roundings
        colour = ORIENTATION_COLOURS[h]
        if field.mirrored[h]:
            assert (path.get("fill"), path.get("stroke")) == ("none", colour), "mirrored: outlined"
        else:
            assert path.get("fill") == colour and path.get("stroke") is None, "rotations: filled"


def test_the_background_is_the_mosaics_pixels_and_titles_are_text():
    root = ET.fromstring(arrow_panels_svg(made_up_field(), IMAGES, TITLES))
    mosaic = PanelMosaic(8, 24)
    assert root.get("viewBox") == f"-0.5 -0.5 {mosaic.width} {mosaic.height}"
    href = root.find(f"{SVG}image").get("href")
    assert href.startswith("data:image/png;base64,")
    pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(href.split(",", 1)[1]))))
    np.testing.assert_array_equal(pixels, np.round(mosaic.background(list(IMAGES)) * 255).astype(np.uint8))
    assert [text.text for text in root.findall(f"{SVG}text")] == TITLES, "titles as text, escaped in the markup"


def test_no_arrows_leaves_the_picture_and_no_empty_paths():
    field = made_up_field()
    empty = ArrowField(**{**field.__dict__, "lengths": np.zeros_like(field.lengths)})
    root = ET.fromstring(arrow_panels_svg(empty, IMAGES, TITLES))
    assert root.findall(f"{SVG}path") == [] and root.find(f"{SVG}image") is not None
