"""flip_and_crop: each output is its input flipped (or not) and shifted, reproducibly per generator."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from training.data.augment import flip_and_crop


def reference(image: torch.Tensor, flip: bool, dy: int, dx: int, padding: int) -> torch.Tensor:
    """The slow way, one image: pad, crop, then mirror."""
    h, w = image.shape[-2:]
    crop = F.pad(image, (padding,) * 4)[:, dy:dy + h, dx:dx + w]
    return crop.flip(-1) if flip else crop


@pytest.mark.parametrize("padding, size", [(4, (32, 32)), (2, (5, 7))])
def test_each_output_is_a_flipped_shifted_copy(padding, size):
    images = torch.rand(64, 3, *size)
    out = flip_and_crop(images, torch.Generator().manual_seed(1), padding=padding)
    assert out.shape == images.shape and out.dtype == images.dtype
    candidates = [(f, dy, dx) for f in (False, True) for dy in range(2 * padding + 1) for dx in range(2 * padding + 1)]
    seen_flips, seen_shifts = set(), set()
    for image, result in zip(images, out, strict=True):
        matches = [c for c in candidates if torch.equal(reference(image, *c, padding), result)]
        assert len(matches) == 1, "output is not a flipped/shifted copy of its input"
        seen_flips.add(matches[0][0])
        seen_shifts.add(matches[0][1:])
    assert seen_flips == {False, True} and len(seen_shifts) > 10  # both flips and many shifts drawn


def test_reproducible_with_the_same_generator():
    images = torch.rand(16, 3, 32, 32)
    a = flip_and_crop(images, torch.Generator().manual_seed(7))
    b = flip_and_crop(images, torch.Generator().manual_seed(7))
    c = flip_and_crop(images, torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_matches_the_draws_in_documented_order():
    images = torch.rand(8, 1, 6, 6, dtype=torch.float64)
    generator = torch.Generator().manual_seed(3)
    flip = torch.rand(8, generator=generator) < 0.5
    dy = torch.randint(0, 9, (8,), generator=generator)
    dx = torch.randint(0, 9, (8,), generator=generator)
    out = flip_and_crop(images, torch.Generator().manual_seed(3))
    for i in range(8):
        assert torch.equal(out[i], reference(images[i], bool(flip[i]), int(dy[i]), int(dx[i]), 4))


def test_rejects_unbatched_input():
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        flip_and_crop(torch.rand(3, 32, 32), torch.Generator())
