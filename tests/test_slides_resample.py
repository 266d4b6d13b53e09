"""A block of a slide at the model's scale is the same block of region mode's whole resampling
(:func:`app.cells.evaluation.to_model_scale`), read from just the pixels it needs (:mod:`app.slides.resample`)."""

from __future__ import annotations

import numpy as np
import pytest

from app.cells.evaluation import to_model_scale
from app.slides.resample import input_span, model_side, resample_block

PCAM_MPP = 0.972
FLOAT32_ULP = 1.2e-7  # one unit in the last place of float32 near 1: the two sum in another order


@pytest.mark.parametrize(("rows", "cols", "mpp"), [(301, 257, 0.499), (200, 180, 0.25), (100, 90, 1.5),
                                                   (64, 64, PCAM_MPP), (65, 63, PCAM_MPP)],
                         ids=["20x", "40x", "downsampled level", "model scale", "odd sides stretched"])
def test_any_block_is_the_whole_resamplings_block(rows, cols, mpp):
    image = np.random.default_rng(rows).random((3, rows, cols)).astype(np.float32)
    whole = to_model_scale(image, mpp, PCAM_MPP)
    size = model_side(rows, mpp / PCAM_MPP), model_side(cols, mpp / PCAM_MPP)
    assert whole.shape[1:] == size
    model_rows, model_cols = size
    for top, bottom, left, right in [(0, model_rows, 0, model_cols), (3, model_rows // 2, 7, model_cols // 2 + 3),
                                     (model_rows - 20, model_rows, model_cols - 11, model_cols)]:
        (r0, r1), (c0, c1) = input_span(rows, model_rows, top, bottom), input_span(cols, model_cols, left, right)
        block = resample_block(image[:, r0:r1, c0:c1], (r0, c0), (rows, cols), size, (top, bottom, left, right))
        assert np.abs(block - whole[:, top:bottom, left:right]).max() <= FLOAT32_ULP, (top, left)


def test_a_block_reads_only_the_pixels_around_it_and_says_when_they_are_missing():
    (first, stop) = input_span(2967, model_side(2967, 0.499 / PCAM_MPP), 100, 196)  # a 96-pixel context
    assert 190 <= first and stop <= 385 and stop - first <= 190 + 4, "about 96 / 0.513 inputs, and no more"
    image = np.zeros((3, 50, 50), dtype=np.float32)
    with pytest.raises(ValueError, match=r"the pixels from \(10, 10\) do not hold the inputs of block"):
        resample_block(image, (10, 10), (300, 300), (150, 150), (0, 20, 0, 20))
