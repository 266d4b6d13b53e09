"""Group elements and arbitrary rotations on image arrays, and the arrow direction of each element."""

import numpy as np
import pytest
import torch

from app.analysis.transforms import apply_element, arrow_direction, rotate_by_angle
from models import P4M


@pytest.mark.parametrize("g", range(8))
def test_elements_act_as_the_library_does(g):
    image = np.random.default_rng(g).random((3, 9, 9)).astype(np.float32)
    assert np.array_equal(apply_element(image, g), P4M.act_on_plane(torch.from_numpy(image), g).numpy())


@pytest.mark.parametrize("size", [9, 10])
@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_quarter_turns_by_angle_equal_the_group_element(size, k):
    image = np.random.default_rng(size).random((2, size, size)).astype(np.float32)
    rotated = rotate_by_angle(image, 90 * k)
    exact = apply_element(image, k)
    assert np.abs(rotated[:, 1:-1, 1:-1] - exact[:, 1:-1, 1:-1]).max() <= 1e-6
    assert np.abs(rotate_by_angle(image, 90 * k - 360) - exact)[:, 1:-1, 1:-1].max() <= 1e-6


def test_rotation_is_counter_clockwise_as_displayed():
    # A bright pixel right of the centre moves up (smaller row) for a small positive angle.
    image = np.zeros((21, 21), np.float32)
    image[10, 18] = 1
    rows, cols = np.nonzero(rotate_by_angle(image, 20) > 0.2)
    assert rows.mean() < 10 and cols.mean() > 10
    # And the composition of two angles is the sum (away from the zero-filled corners).
    smooth = np.exp(-((np.arange(21)[:, None] - 7.0) ** 2 + (np.arange(21)[None] - 12.0) ** 2) / 8).astype(np.float32)
    twice = rotate_by_angle(rotate_by_angle(smooth, 25), 20)
    assert np.abs(twice - rotate_by_angle(smooth, 45)).max() < 0.05


def test_arrow_directions():
    assert [arrow_direction(g) for g in range(4)] == [(0, 1), (-1, 0), (0, -1), (1, 0)]  # right, up, left, down
    assert [arrow_direction(g) for g in range(4, 8)] == [(0, 1), (1, 0), (0, -1), (-1, 0)]  # reflected
