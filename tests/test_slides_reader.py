"""Whole slides and ordinary images through one reader (:mod:`app.slides.reader`), their scale
(:mod:`app.slides.scale`) and their tissue (:mod:`app.slides.tissue`), on the two real Aperio slides in
``../shared/data/slides`` (skipped without them, failed under REQUIRE_REFERENCE=1) and on files made here."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from app.slides.reader import SlideError, open_slide
from app.slides.scale import slide_scale
from app.slides.tissue import otsu_threshold, pen_mask, tissue_mask
from tests.conftest import REPO, require_shared

SLIDES = REPO.parent / "shared" / "data" / "slides"
CMU, TCGA = SLIDES / "CMU-1-Small-Region.svs", SLIDES / "tcga-cr-7395-01a-01-ts1.svs"


def real(path):
    return require_shared(path, f"{path} not found (the real slides live in ../shared/data/slides)")


def test_the_cmu_slide_opens_with_its_levels_scale_and_associated_images():
    with open_slide(real(CMU)) as slide:
        assert (slide.vendor, slide.dimensions, slide.level_count) == ("aperio", (2220, 2967), 1)
        assert slide.associated == ("label", "macro", "thumbnail")
        assert slide.associated_image("label").shape == (463, 387, 3)
        scale = slide_scale(slide.properties)
        assert (scale.microns_per_pixel, scale.source) == (0.499, "slide")
        region = slide.read_region(1000, 1500, 0, 96, 64)
        assert region.shape == (64, 96, 3) and region.dtype == np.uint8 and region.std() > 10, "tissue, not glass"
        beyond = slide.read_region(2200, 2950, 0, 40, 40)
        assert (beyond[20:, 20:] == 255).all(), "outside the slide is white glass"
        with pytest.raises(SlideError, match="has no macro2 image"):
            slide.associated_image("macro2")
        with pytest.raises(SlideError, match="has levels 0 to 0, not 1"):
            slide.read_region(0, 0, 1, 10, 10)


def test_the_tcga_slide_has_two_levels_and_no_scale_until_one_is_given():
    with open_slide(real(TCGA)) as slide:
        assert slide.level_dimensions == ((4443, 3567), (2221, 1783)) and slide.best_level(4.0) == 1
        scale = slide_scale(slide.properties)
        assert scale.microns_per_pixel is None and "not analysed until its scale" in scale.sentence
        given = slide_scale(slide.properties, 0.5)
        assert (given.microns_per_pixel, given.source) == (0.5, "user")
        thumbnail = slide.thumbnail(512)  # from level 1 (JPEG 2000 tiles), never upsampled
        assert thumbnail.shape == (411, 512, 3)


def test_the_objective_power_gives_an_assumed_scale_and_bad_scales_are_refused():
    assumed = slide_scale({"openslide.objective-power": "40"})
    assert (assumed.microns_per_pixel, assumed.source) == (0.25, "objective") and "assumed" in assumed.sentence
    assert slide_scale({"openslide.mpp-x": "0.5", "openslide.mpp-y": "0.9"}).microns_per_pixel is None
    assert slide_scale({"openslide.mpp-x": "nan", "openslide.mpp-y": "nan"}).source == "none"
    with pytest.raises(ValueError, match="outside 0.05 to 20.0 um/px"):
        slide_scale({}, 0.0)


def test_an_ordinary_image_is_a_slide_of_one_level(tmp_path):
    pixels = np.random.default_rng(0).integers(0, 256, (50, 70, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "patch.png")
    with open_slide(tmp_path / "patch.png") as slide:
        assert (slide.vendor, slide.dimensions, slide.level_count, slide.associated) == ("image", (70, 50), 1, ())
        np.testing.assert_array_equal(slide.read_region(10, 5, 0, 20, 30), pixels[5:35, 10:30])
        corner = slide.read_region(-5, -5, 0, 10, 10)
        assert (corner[:5] == 255).all() and (corner[5:, 5:] == pixels[:5, :5]).all()
        assert slide_scale(slide.properties).source == "none", "an image's scale comes from the user"


def test_an_image_is_decoded_as_the_patch_page_decodes_it(tmp_path):
    """One decoder for images (app.analysis.images): EXIF orientation applied, 16 bits and alpha over white as
    read_image gives them (rounded to 8 bits, the form of every slide's pixels), grey levels marked as not colour."""
    from app.analysis.images import read_image

    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (40, 60, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    Image.fromarray(pixels).save(tmp_path / "turned.png", exif=exif.tobytes())
    deep = rng.integers(0, 65536, (30, 20), dtype=np.uint16)
    Image.fromarray(deep).save(tmp_path / "deep.png")
    rgba = rng.integers(0, 256, (16, 24, 4), dtype=np.uint8)
    Image.fromarray(rgba, "RGBA").save(tmp_path / "clear.png")
    for name in ("turned.png", "deep.png", "clear.png"):
        with open_slide(tmp_path / name) as slide:
            expected = read_image((tmp_path / name).read_bytes())
            colour = expected.shape[0] == 3
            expected = np.round(np.repeat(expected, 3 // expected.shape[0], axis=0) * 255).transpose(1, 2, 0)
            width, height = slide.dimensions
            np.testing.assert_array_equal(slide.read_region(0, 0, 0, width, height), expected, err_msg=name)
            assert slide.colour == colour, name
    with open_slide(tmp_path / "turned.png") as slide:
        assert slide.dimensions == (40, 60), "EXIF's quarter turn applied: 60 rows, 40 columns"
        np.testing.assert_array_equal(slide.read_region(0, 0, 0, 40, 60), np.rot90(pixels, -1))


def test_a_grey_image_is_shown_but_not_analysed(tmp_path):
    from app.slides.run import plan_slide

    Image.fromarray(np.full((300, 300), 128, dtype=np.uint8)).save(tmp_path / "grey.png")
    with pytest.raises(SlideError, match="grey.png is an image of grey levels: an H&E model judges colour"):
        plan_slide(tmp_path / "grey.png", REPO / "checkpoints" / "fa_p4m_densenet_pcam.safetensors", tmp_path, 0.5)


def test_an_image_too_large_or_truncated_is_refused_with_a_sentence(tmp_path):
    from app.slides.reader import MAX_IMAGE_PIXELS

    side = int(MAX_IMAGE_PIXELS ** 0.5) + 1
    Image.new("L", (side, side), 255).save(tmp_path / "huge.png")  # compresses to a few hundred kB
    with pytest.raises(SlideError, match=f"huge.png is {side:,} x {side:,} pixels, more than this server decodes "
                                         r"\(89 MP\): make it a tiled pyramidal TIFF first \(`vips tiffsave"):
        open_slide(tmp_path / "huge.png")
    noise = np.random.default_rng(2).integers(0, 256, (200, 200, 3), dtype=np.uint8)
    Image.fromarray(noise).save(tmp_path / "whole.png")
    (tmp_path / "cut.png").write_bytes((tmp_path / "whole.png").read_bytes()[:5000])
    with pytest.raises(SlideError, match="cut.png is neither a slide OpenSlide reads nor an image this app reads: "
                                         "the image file is truncated or corrupt"):
        open_slide(tmp_path / "cut.png")


def test_bad_files_are_named_with_a_sentence(tmp_path):
    with pytest.raises(SlideError, match="missing.svs: no such file"):
        open_slide(tmp_path / "missing.svs")
    (tmp_path / "empty.svs").write_bytes(b"")
    with pytest.raises(SlideError, match=r"empty.svs is empty \(0 bytes\)"):
        open_slide(tmp_path / "empty.svs")
    (tmp_path / "text.svs").write_text("not a slide at all")
    with pytest.raises(SlideError, match="text.svs is not a slide: OpenSlide does not recognise its contents"):
        open_slide(tmp_path / "text.svs")
    (tmp_path / "text.png").write_text("not an image either")
    with pytest.raises(SlideError, match="text.png is neither a slide OpenSlide reads nor an image this app reads"):
        open_slide(tmp_path / "text.png")
    data = real(CMU).read_bytes()
    for kept in (len(data) // 3, len(data) - 1000):
        (tmp_path / "truncated.svs").write_bytes(data[:kept])
        with pytest.raises(SlideError, match="truncated.svs is a TIFF-based slide that OpenSlide cannot read: the "
                                             "file is truncated or damaged"):
            open_slide(tmp_path / "truncated.svs")


def test_a_jpeg_renamed_svs_is_refused_saying_what_it_is(tmp_path):
    """A name that promises a slide is held to it; the same bytes named .jpg open as an image."""
    Image.fromarray(np.full((40, 60, 3), 200, dtype=np.uint8)).save(tmp_path / "photo.svs", format="JPEG")
    with pytest.raises(SlideError, match=r"photo.svs is named as a slide \(.svs\) but holds a JPEG image"):
        open_slide(tmp_path / "photo.svs")
    (tmp_path / "photo.svs").rename(tmp_path / "photo.jpg")
    with open_slide(tmp_path / "photo.jpg") as slide:
        assert (slide.vendor, slide.dimensions) == ("image", (60, 40))


def test_otsu_splits_two_populations_between_them():
    values = np.concatenate([np.full(700, 0.03), np.full(300, 0.6)])
    assert 0.03 <= otsu_threshold(values) < 0.6


def test_the_cmu_tissue_leaves_out_glass_and_pen():
    with open_slide(real(CMU)) as slide:
        thumbnail = slide.thumbnail(512)
        mpp = 0.499 * slide.dimensions[0] / thumbnail.shape[1]
    mask, threshold = tissue_mask(thumbnail, mpp)
    assert 0.25 < mask.mean() < 0.5 and threshold >= 0.15
    # Open glass: every pixel of a 21-pixel square (60 um) around is nearly white. (Pale gaps inside the tissue are
    # tissue: the closing fills them.)
    white = np.pad(thumbnail.min(axis=-1) > 230, 10, constant_values=True)
    glass = np.lib.stride_tricks.sliding_window_view(white, (21, 21)).all(axis=(-2, -1))
    assert glass.mean() > 0.3 and not (mask & glass).any(), "glass is not tissue"
    # A blue pen stroke drawn over the tissue is left out; the tissue around it stays.
    inked = thumbnail.copy()
    inked[200:210, 100:300] = (40, 70, 200)
    assert pen_mask(inked)[200:210, 100:300].all()
    inked_mask, _ = tissue_mask(inked, mpp)
    assert not inked_mask[202:208, 120:280].any()


def test_pen_ink_is_the_hue_and_saturation_rule_exactly_ties_included():
    """The integer rule against hue and saturation in floats, on every third 8-bit level (636,056 colours): the
    same except at exact ties, which the rule decides as written (hue >= 70, hue < 250, saturation > 0.2)."""
    levels = np.append(np.arange(0, 256, 3), 255)
    rgb = np.stack(np.meshgrid(levels, levels, levels, indexing="ij"), axis=-1).reshape(-1, 1, 3)
    r, g, b = (rgb[..., k].astype(np.float64) for k in range(3))
    high, low = np.maximum(np.maximum(r, g), b), np.minimum(np.minimum(r, g), b)
    spread = high - low
    safe = np.where(spread > 0, spread, 1.0)
    hue = 60.0 * np.where(high == r, ((g - b) / safe) % 6,
                          np.where(high == g, (b - r) / safe + 2, (r - g) / safe + 4))
    saturation = np.divide(spread, high, out=np.zeros_like(high), where=high > 0)
    floats = ((hue >= 70) & (hue < 250) & (saturation > 0.2)) | (high < 40)
    ints = rgb.astype(np.int64)
    tie = ((6 * (ints[..., 2] - ints[..., 0]) == -5 * spread) | (6 * (ints[..., 0] - ints[..., 1]) == spread)
           | (5 * spread == high))
    integer = pen_mask(rgb.astype(np.uint8))
    assert np.array_equal(integer[~tie], floats[~tie])
    # ties as written: hue exactly 70 is ink, exactly 250 is not, saturation exactly 0.2 is not
    assert pen_mask(np.array([[[34, 40, 4], [36, 33, 51], [36, 36, 45]]], dtype=np.uint8)).tolist() == [
        [True, False, False]]


def test_a_slide_of_glass_has_no_tissue():
    glass = np.full((300, 300, 3), 242, dtype=np.uint8) + np.random.default_rng(1).integers(0, 6, (300, 300, 3),
                                                                                              dtype=np.uint8)
    mask, threshold = tissue_mask(glass, 8.0)
    assert not mask.any() and threshold == 0.15
