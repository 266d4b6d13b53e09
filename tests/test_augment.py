"""flip_and_crop: each output is its input flipped (or not) and shifted, reproducibly per generator;
group_and_stain: a stain change by colour deconvolution, then an element of p4m;
jpeg_recompress: half the patches compressed again, at the drawn quality, exactly as Pillow does;
random_rotation: each digit turned by its own uniform angle."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from training.data.augment import flip_and_crop, group_and_stain, jpeg_recompress, random_rotation, redraw_rotation
from training.data.rot_mnist import rotate_images


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


def p4m_images(image: torch.Tensor) -> list[torch.Tensor]:
    return [torch.rot90(torch.flip(image, (-1,)) if m else image, k, (-2, -1)) for m in (0, 1) for k in range(4)]


def test_group_and_stain_without_stain_change_is_a_p4m_element_of_each_image():
    images = torch.rand(16, 3, 12, 12, dtype=torch.float64) * 0.9 + 0.05
    out = group_and_stain(images, torch.Generator().manual_seed(0), scale=0.0, shift=0.0)
    seen = set()
    for image, moved in zip(images, out, strict=True):
        errors = [(candidate - moved).abs().max().item() for candidate in p4m_images(image)]
        assert min(errors) < 1e-12, "each output is the input under one element of p4m"
        seen.add(int(np.argmin(errors)))
    assert len(seen) > 3, "the elements are drawn at random"


def test_group_and_stain_scales_and_shifts_stain_concentrations_as_documented():
    from models.stain import hed_to_rgb, rgb_to_hed

    images = torch.rand(6, 3, 10, 10, dtype=torch.float64)
    out = group_and_stain(images, torch.Generator().manual_seed(3), scale=0.2, shift=0.05)
    draws = torch.Generator().manual_seed(3)
    factor = 1 + 0.2 * (2 * torch.rand(6, 3, generator=draws) - 1)
    offset = 0.05 * (2 * torch.rand(6, 3, generator=draws) - 1)
    mirror = (torch.rand(6, generator=draws) < 0.5).tolist()
    turns = torch.randint(0, 4, (6,), generator=draws).tolist()
    for i in range(6):
        hed = rgb_to_hed(255 * images[i].permute(1, 2, 0).numpy()) * factor[i].numpy() + offset[i].numpy()
        rgb = torch.from_numpy(np.clip(hed_to_rgb(hed) / 255, 0, 1)).permute(2, 0, 1)
        expected = torch.rot90(torch.flip(rgb, (-1,)) if mirror[i] else rgb, turns[i], (-2, -1))
        assert torch.allclose(out[i], expected, atol=1e-12), f"image {i}: stain change then p4m element"


def test_group_and_stain_rejects_non_rgb_or_non_square():
    with pytest.raises(ValueError, match=r"square RGB"):
        group_and_stain(torch.rand(2, 1, 8, 8), torch.Generator())
    with pytest.raises(ValueError, match=r"square RGB"):
        group_and_stain(torch.rand(2, 3, 8, 10), torch.Generator())


def test_random_rotation_turns_each_image_by_its_documented_angle():
    images = torch.rand(32, 1, 28, 28)
    angles = 360 * torch.rand(32, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    out = random_rotation(images, torch.Generator().manual_seed(5))
    assert out.shape == images.shape and out.dtype == images.dtype
    assert torch.equal(out, rotate_images(images, angles))
    assert angles.min() >= 0 and angles.max() < 360 and angles.std() > 60  # spread over the circle


def test_random_rotation_keeps_a_centred_disc_and_moves_an_off_centre_stroke():
    y, x = torch.meshgrid(torch.arange(28.0) - 13.5, torch.arange(28.0) - 13.5, indexing="ij")
    disc = ((x ** 2 + y ** 2) < 8 ** 2).float().expand(16, 1, 28, 28)
    stroke = torch.zeros(16, 1, 28, 28)
    stroke[..., 12:16, 18:26] = 1  # right of the centre
    generator = torch.Generator().manual_seed(0)
    turned_disc, turned_stroke = random_rotation(disc, generator), random_rotation(stroke, generator)
    # a disc looks the same at every angle, up to its anti-aliased rim
    assert (turned_disc - disc).abs().mean() < 0.02
    # the stroke's mass stays (it lies inside the circle the corners leave), its place changes from image to image
    assert torch.allclose(turned_stroke.sum((1, 2, 3)), stroke.sum((1, 2, 3)), rtol=0.02)
    assert turned_stroke.std(0).max() > 0.3


def test_random_rotation_is_reproducible_and_rejects_unbatched_input():
    images = torch.rand(8, 1, 28, 28)
    assert torch.equal(random_rotation(images, torch.Generator().manual_seed(1)),
                       random_rotation(images, torch.Generator().manual_seed(1)))
    assert not torch.equal(random_rotation(images, torch.Generator().manual_seed(1)),
                           random_rotation(images, torch.Generator().manual_seed(2)))
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        random_rotation(torch.rand(1, 28, 28), torch.Generator())


def test_redraw_rotation_turns_the_upright_digit_once_and_rounds_to_8_bits_like_the_dataset():
    upright = torch.randint(0, 256, (16, 1, 28, 28)).float() / 255
    angles = 360 * torch.rand(16, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    out = redraw_rotation(upright, torch.Generator().manual_seed(3))
    assert out.shape == upright.shape and out.dtype == upright.dtype
    assert torch.equal(out * 255, (out * 255).round()) and out.min() >= 0 and out.max() <= 1
    expected = rotate_images(upright * 255, angles).round().clamp(0, 255) / 255
    assert torch.equal(out, expected)
    assert torch.equal(out, redraw_rotation(upright, torch.Generator().manual_seed(3)))


def test_jpeg_recompress_compresses_the_drawn_images_at_the_drawn_quality():
    import io

    from PIL import Image

    torch.manual_seed(0)
    images = torch.rand(16, 3, 24, 24).mul(255).round().div(255)  # on the 8-bit grid, as decoded patches are
    out = jpeg_recompress(images, torch.Generator().manual_seed(3))
    draws = torch.Generator().manual_seed(3)
    chosen = (torch.rand(16, generator=draws) < 0.5).tolist()
    quality = torch.randint(60, 96, (16,), generator=draws).tolist()
    assert 0 < sum(chosen) < 16
    for image, result, was_chosen, q in zip(images, out, chosen, quality, strict=True):
        if not was_chosen:
            assert torch.equal(result, image)
            continue
        buffer = io.BytesIO()
        Image.fromarray((image * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()).save(
            buffer, format="JPEG", quality=q)
        expected = torch.from_numpy(np.asarray(Image.open(buffer).convert("RGB")).copy()).permute(2, 0, 1) / 255
        assert torch.equal(result, expected)
    assert torch.equal(jpeg_recompress(images, torch.Generator().manual_seed(3)), out), "reproducible"
    with pytest.raises(ValueError, match=r"images must be RGB \(B, 3, H, W\)"):
        jpeg_recompress(images[:, :1], torch.Generator())
