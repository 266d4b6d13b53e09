"""flip_and_crop: each output is its input flipped (or not) and shifted, reproducibly per generator;
group_and_stain: a stain change by colour deconvolution, then an element of p4m;
jpeg_recompress: half the patches compressed again, at the drawn quality, exactly as Pillow does;
random_rotation: each digit turned by its own uniform angle;
group_hed_light / group_hed_strong: Tellez's HED scales, their draws within range, equivariance kept, and a 2-step
training run that names them in its card."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from training.data.augment import (
    STAIN_SCALES,
    flip_and_crop,
    group_and_stain,
    hed_jitter,
    jpeg_recompress,
    random_rotation,
    redraw_rotation,
)
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


@pytest.mark.parametrize("name, size", [("group_hed_light", 0.05), ("group_hed_strong", 0.2)])
def test_tellez_hed_scales_draw_each_stains_factor_within_one_plus_minus_sigma(name, size):
    """Measured on the draws: each stain's factor within 1 +- sigma and offset within +- bias, spread over the range,
    and the jitter the documented map of each image's concentrations (models.stain's deconvolution)."""
    from models.stain import hed_to_rgb, rgb_to_hed

    assert STAIN_SCALES[name] == {"scale": size, "shift": size}
    images = torch.rand(400, 3, 4, 4, dtype=torch.float64) * 0.8 + 0.1
    out = hed_jitter(images, torch.Generator().manual_seed(5), **STAIN_SCALES[name])
    draws = torch.Generator().manual_seed(5)
    factor = (1 + size * (2 * torch.rand(400, 3, generator=draws) - 1)).double()  # drawn in float32, as documented
    offset = (size * (2 * torch.rand(400, 3, generator=draws) - 1)).double()
    assert ((factor - 1).abs() <= size).all() and (offset.abs() <= size).all()
    assert (factor - 1).abs().max() > 0.95 * size and abs(float(factor.mean()) - 1) < 0.1 * size
    for i in (0, 199, 399):
        hed = rgb_to_hed(255 * images[i].permute(1, 2, 0).numpy()) * factor[i].numpy() + offset[i].numpy()
        expected = np.clip(hed_to_rgb(hed) / 255, 0, 1)
        assert np.abs(out[i].permute(1, 2, 0).numpy() - expected).max() < 1e-6
    # Read back from the output: the haematoxylin of two pixels of one image changes by the same factor + offset.
    before = rgb_to_hed(255 * images.permute(0, 2, 3, 1).numpy())[..., 0].reshape(400, -1)
    after = rgb_to_hed(255 * out.permute(0, 2, 3, 1).numpy())[..., 0].reshape(400, -1)
    unclipped = ((out > 0) & (out < 1)).flatten(1).all(dim=1).numpy()
    slope = (after[:, 1] - after[:, 0]) / (before[:, 1] - before[:, 0])
    assert np.allclose(slope[unclipped], factor[unclipped, 0].numpy(), atol=1e-6)


@pytest.mark.parametrize("name", ["group_hed_light", "group_hed_strong"])
def test_hed_augmentation_keeps_equivariance_each_output_is_a_p4m_element_of_the_jittered_image(name):
    """The colour change acts on each pixel alone and the p4m element comes after it, so every output is exactly
    (1e-12) one element of p4m applied to the jittered image: a p4m-invariant network's answer is the jittered
    image's, whatever element was drawn."""
    images = torch.rand(16, 3, 9, 9, dtype=torch.float64) * 0.9 + 0.05
    moved = group_and_stain(images, torch.Generator().manual_seed(2), **STAIN_SCALES[name])
    still = hed_jitter(images, torch.Generator().manual_seed(2), **STAIN_SCALES[name])
    assert not torch.allclose(still, images, atol=1e-3)
    seen = set()
    for image, out in zip(still, moved, strict=True):
        errors = [(candidate - out).abs().max().item() for candidate in p4m_images(image)]
        assert min(errors) < 1e-12
        seen.add(int(np.argmin(errors)))
    assert len(seen) > 3
    # and the jitter commutes with every element itself: jittering a turned image turns the jittered one
    for g, turned in enumerate(p4m_images(images[0])):
        again = hed_jitter(turned[None], torch.Generator().manual_seed(9), **STAIN_SCALES[name])[0]
        base = hed_jitter(images[:1], torch.Generator().manual_seed(9), **STAIN_SCALES[name])[0]
        assert torch.allclose(again, p4m_images(base)[g], atol=1e-12), g


def test_a_two_step_run_with_hed_strong_writes_a_card_naming_it(tmp_path, monkeypatch):
    import csv
    import json
    import shutil

    from conftest import REPO, require_shared

    from training.cli import main as cli_main

    public = REPO.parent / "shared" / "data" / "pcam_public"
    require_shared(public / "labels.csv", f"{public} not found (real PCam patches live in ../shared/data)")
    with open(public / "labels.csv", newline="") as f:
        reader = csv.DictReader(f)
        header, rows = reader.fieldnames, list(reader)
    chosen = [next(r for r in rows if r["split"] == split and r["label"] == label)
              for split in ("train", "valid", "test") for label in ("0", "1")]
    root = tmp_path / "pcam_public"
    for row in chosen:
        (root / row["split"]).mkdir(parents=True, exist_ok=True)
        shutil.copy2(public / row["file"], root / row["file"])
    with open(root / "labels.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows(chosen)
    monkeypatch.setenv("AAGC_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    assert cli_main(["train", "pcam_table3", "--data-dir", str(root), "--out", str(out), "--model", "densenet",
                     "--epochs", "1", "--batch-size", "1", "--epoch-size", "2", "--max-steps", "2",
                     "--augment", "group_hed_strong", "--precision", "fp32", "--eval-batch-size", "2",
                     "--max-eval-batches", "1", "--equivariance-images", "2", "--threads", "1"]) == 0
    card = json.loads((out / "best.json").read_text())
    assert card["training"]["config"]["augment"] == "group_hed_strong"
    assert card["training"]["steps"] == 2
