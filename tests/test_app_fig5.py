"""The paper's Fig. 5 picture: its layout and that its maps are the app's composite."""

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_app_compute import calibrated, card_for, random_image

import models
from app.analysis.compute import analyse
from app.analysis.images import fit_to_model, read_image
from app.pictures.fig5 import FIG5_TRANSFORMS, fig5_png, fig5_rows

SHIPPED_PCAM = "checkpoints/fa_p4m_densenet_pcam.safetensors"
PATCHES = ("app/gallery/pcam_tumour_0a5f22f6a5.jpg", "app/gallery/pcam_normal_87ceb2985c.jpg")


@pytest.fixture(scope="module")
def shipped():
    model, card = models.load_checkpoint(SHIPPED_PCAM)
    images = [fit_to_model(read_image(Path(path).read_bytes()), 96, 3).pixels for path in PATCHES]
    return model, card, images


def test_composite_panels_are_the_apps_composite_summed_over_orientations(shipped):
    model, card, images = shipped
    rows = fig5_rows(model, card, images, ["tumour", "normal"])
    assert [row.title for row in rows] == ["tumour", "normal"]
    for row, image in zip(rows, images, strict=True):
        analysis = analyse(model, card, image)
        assert row.transforms == FIG5_TRANSFORMS and row.names == ("rot 0°", "rot 90°", "rot 0° + flip")
        expected = analysis.composite.maps[list(FIG5_TRANSFORMS)].sum(axis=1)  # (3, 96, 96)
        np.testing.assert_array_equal(row.composite, expected)
        np.testing.assert_array_equal(row.images, analysis.images[list(FIG5_TRANSFORMS)])
        # A quarter turn of the patch turns its map: the panels show the same values moved.
        np.testing.assert_allclose(row.composite[1], np.rot90(row.composite[0]), rtol=1e-4, atol=0)
        assert row.field.lengths.shape == (8, 8, 64), "arrows of all eight transforms, 8 x 8 cells"


def test_the_png_has_a_row_per_patch_and_nine_panels_of_ink(shipped):
    model, card, images = shipped
    png = fig5_png(model, card, images, ["tumour", "normal"], dpi=40)
    picture = Image.open(io.BytesIO(png))
    assert picture.format == "PNG"
    # Figure 1.6 inches a panel (9 panels) plus 1.2 wide, 1.78 a row (2 rows) plus 0.9 high, at 40 dpi.
    assert picture.size == (round(40 * (1.6 * 9 + 1.2)), round(40 * (1.78 * 2 + 0.9)))
    pixels = np.asarray(picture.convert("RGB"), dtype=np.float64)
    assert pixels.std() > 30, "not a blank page"
    # viridis' dark purple (68, 1, 84) and yellow-green appear: composite panels were drawn.
    assert ((np.abs(pixels - (68, 1, 84)).sum(axis=-1) < 60).mean() > 0.001)


def test_refuses_a_model_without_a_composite_and_titles_that_do_not_match():
    planar = calibrated("z2cnn")
    with pytest.raises(ValueError, match="no spatial attention"):
        fig5_rows(planar, card_for("z2cnn"), [random_image("z2cnn")], ["digit"])
    model = calibrated("fa_p4cnn")
    with pytest.raises(ValueError, match="one title per image: 2 titles for 1 images"):
        fig5_rows(model, card_for("fa_p4cnn"), [random_image("fa_p4cnn")], ["a", "b"])
    rows = fig5_rows(model, card_for("fa_p4cnn"), [random_image("fa_p4cnn")], ["digit"])
    assert rows[0].transforms == (0, 1), "p4 has no mirror: only the identity and the quarter turn"
