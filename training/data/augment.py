"""Batch augmentations that run on tensors, on whatever device the batch lives on.

``flip_and_crop`` is the "CIFAR10+" augmentation of the paper's CIFAR-10 experiments (as in
the ResNet paper): a random horizontal flip and a random 32x32 crop of the image padded by 4
zero pixels. It is done for the whole batch with two gathers instead of a loop per image.

``random_rotation`` turns each rot-MNIST digit by a fresh uniform angle: the dataset's digits are already
turned by uniform angles, so this draws new examples from the same distribution (up to one more bilinear
interpolation), not from a different one. ``redraw_rotation`` does the same from the upright digit, with
one interpolation and the dataset's rounding to 8 bits, so that the digits it draws are exactly as sharp as
the test digits (one more interpolation takes a quarter of a digit's gradient energy away).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from models.stain_normalise import HED_LIGHT, HED_STRONG

__all__ = ["flip_and_crop", "group_and_stain", "group_element", "hed_jitter", "jpeg_recompress", "jpeg_round_trip",
           "random_rotation", "redraw_rotation", "STRONG_STAIN", "STAIN_SCALES", "JPEG_QUALITIES"]

# Stronger stain jitter, between the "HED-light" and "HED-strong" ranges of Tellez et al. (2019): slides differ
# more in how much stain they took up than in their baseline.
STRONG_STAIN = {"scale": 0.2, "shift": 0.05}
# The stain jitter of each H&E augment name (TrainConfig.augment): group_stain's own defaults, the stronger one, and
# Tellez et al.'s HED-light (sigma = bias = 0.05) and HED-strong (0.2), the scales models.stain_normalise names.
STAIN_SCALES = {
    "group_stain": {"scale": 0.1, "shift": 0.03},
    "group_stain_jpeg": {"scale": 0.1, "shift": 0.03},
    "group_stain_strong": STRONG_STAIN,
    "group_hed_light": {"scale": HED_LIGHT[0], "shift": HED_LIGHT[1]},
    "group_hed_strong": {"scale": HED_STRONG[0], "shift": HED_STRONG[1]},
}
# JPEG qualities drawn by ``jpeg_recompress``: around pcam_public's own (about 75 as committed, 90 re-encoded) and
# what users upload, so that how a patch was compressed tells the model nothing about its label.
JPEG_QUALITIES = (60, 95)


def flip_and_crop(images: torch.Tensor, generator: torch.Generator, padding: int = 4) -> torch.Tensor:
    """Flip each image horizontally with probability 1/2, then crop it at a random shift.

    Output ``b`` is ``padded[b, :, dy:dy+H, dx:dx+W]`` of the zero-padded image (``dy``, ``dx``
    uniform in ``0..2*padding``), mirrored left-right when its coin says so. The random numbers
    are drawn on the generator's device, so a seed gives the same batch on CPU and GPU.

    Args:
        images: ``(B, C, H, W)``.
        generator: the source of all randomness (flip first, then row shifts, then column shifts).
        padding: zero pixels added on each side before cropping.

    Returns:
        ``(B, C, H, W)``, same dtype and device as ``images``.
    """
    if images.ndim != 4:
        raise ValueError(f"images must be (B, C, H, W), got shape {tuple(images.shape)}")
    b, c, h, w = images.shape
    flip = torch.rand(b, generator=generator, device=generator.device) < 0.5
    dy = torch.randint(0, 2 * padding + 1, (b,), generator=generator, device=generator.device)
    dx = torch.randint(0, 2 * padding + 1, (b,), generator=generator, device=generator.device)
    flip, dy, dx = flip.to(images.device), dy.to(images.device), dx.to(images.device)
    padded = F.pad(images, (padding, padding, padding, padding))  # (B, C, H + 2p, W + 2p)
    rows = dy[:, None] + torch.arange(h, device=images.device)  # (B, H)
    columns = torch.arange(w, device=images.device).expand(b, w)
    columns = dx[:, None] + torch.where(flip[:, None], w - 1 - columns, columns)  # (B, W), reversed if flipped
    out = padded.gather(2, rows[:, None, :, None].expand(b, c, h, w + 2 * padding))  # (B, C, H, W + 2p)
    return out.gather(3, columns[:, None, None, :].expand(b, c, h, w))  # (B, C, H, W)


def hed_jitter(images: torch.Tensor, generator: torch.Generator, scale: float, shift: float) -> torch.Tensor:
    """Tellez et al.'s HED colour augmentation on a batch: a random change of each stain's amount, per image.

    Pixels go to haematoxylin, eosin and DAB concentrations by colour deconvolution (``models/stain.py``'s matrices,
    optical density ``-log10((255 x + 1) / 256)``), each concentration ``c`` becomes ``a * c + b`` with ``a``
    uniform in ``1 +- scale`` and ``b`` uniform in ``+-shift`` (per image and stain), and the result goes back to
    RGB, clipped to [0, 1]: ``models.stain_normalise.hed_jitter`` on float batches (Tellez's ``sigma`` is ``scale``,
    his ``bias`` is ``shift``). HED-light is ``scale = shift = 0.05``, HED-strong 0.2 (:data:`STAIN_SCALES`).

    Args:
        images: RGB ``(B, 3, H, W)`` in [0, 1].
        generator: the source of all randomness (factors, then offsets).

    Returns:
        ``(B, 3, H, W)``, same dtype and device.
    """
    from models.stain import HED_FROM_RGB, RGB_FROM_HED

    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be RGB (B, 3, H, W), got shape {tuple(images.shape)}")
    b = images.shape[0]
    draw = dict(generator=generator, device=generator.device)
    factor = (1 + scale * (2 * torch.rand(b, 3, **draw) - 1)).to(images)  # (B, 3) per stain
    offset = (shift * (2 * torch.rand(b, 3, **draw) - 1)).to(images)
    to_hed = torch.as_tensor(HED_FROM_RGB, dtype=images.dtype, device=images.device)
    to_rgb = torch.as_tensor(RGB_FROM_HED, dtype=images.dtype, device=images.device)
    density = -torch.log10((255 * images.movedim(1, -1) + 1) / 256)  # (B, H, W, 3)
    hed = density @ to_hed * factor[:, None, None] + offset[:, None, None]
    return ((256 * 10 ** -(hed @ to_rgb) - 1) / 255).clamp(0, 1).movedim(-1, 1)  # (B, 3, H, W)


def group_element(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Each image under a random element of p4m: mirrored with probability 1/2, then turned by a uniform number of
    quarter turns (draws: all mirrors, then all turns). ``(B, C, H, H)`` in, the same out."""
    b = images.shape[0]
    mirror = (torch.rand(b, generator=generator, device=generator.device) < 0.5).tolist()
    turns = torch.randint(0, 4, (b,), generator=generator, device=generator.device).tolist()
    moved = [torch.rot90(torch.flip(x, (-1,)) if m else x, k, (-2, -1))
             for x, m, k in zip(images, mirror, turns, strict=True)]
    return torch.stack(moved)


def group_and_stain(images: torch.Tensor, generator: torch.Generator, scale: float = 0.1,
                    shift: float = 0.03) -> torch.Tensor:
    """The H&E augmentation: a random change of each stain's amount (:func:`hed_jitter`), then a random element of
    p4m (:func:`group_element`), per image.

    The stain jitter is Tellez et al.'s (2018, 2019) with ``scale`` and ``shift``; the p4m element is the free
    augmentation of the planar baseline (a p4m network's output does not change).

    Args:
        images: RGB ``(B, 3, H, W)`` in [0, 1], H == W.
        generator: the source of all randomness (stain factors, offsets, mirrors, quarter turns, in this order).

    Returns:
        ``(B, 3, H, W)``, same dtype and device.
    """
    if images.ndim != 4 or images.shape[1] != 3 or images.shape[2] != images.shape[3]:
        raise ValueError(f"images must be square RGB (B, 3, H, H), got shape {tuple(images.shape)}")
    return group_element(hed_jitter(images, generator, scale, shift), generator)


def jpeg_round_trip(pixels, **options):
    """One ``(H, W, 3)`` uint8 image saved as JPEG by Pillow with ``options`` (``quality``, or ``qtables`` and
    ``subsampling``) and decoded again: ``(H, W, 3)`` uint8."""
    import io

    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", **options)
    buffer.seek(0)
    with Image.open(buffer) as decoded:
        return np.asarray(decoded.convert("RGB"))


def jpeg_recompress(images: torch.Tensor, generator: torch.Generator, probability: float = 0.5,
                    qualities: tuple[int, int] = JPEG_QUALITIES) -> torch.Tensor:
    """Compress each image as JPEG once more, with probability ``probability``, at a uniform quality in ``qualities``.

    Pillow's encoder with its default 4:2:0 chroma subsampling (:func:`jpeg_round_trip`), on the image rounded to
    8 bits (as a scanner or an upload would store it); the images left alone are returned unchanged.

    Args:
        images: RGB ``(B, 3, H, W)`` in [0, 1], on the CPU.
        generator: the source of all randomness (whether, then which quality, per image, in this order).

    Returns:
        ``(B, 3, H, W)``, same dtype; recompressed images on the 1/255 grid.
    """
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be RGB (B, 3, H, W), got shape {tuple(images.shape)}")
    b = images.shape[0]
    chosen = (torch.rand(b, generator=generator, device=generator.device) < probability).tolist()
    quality = torch.randint(qualities[0], qualities[1] + 1, (b,), generator=generator, device=generator.device).tolist()
    out = images.clone()
    for i in (i for i in range(b) if chosen[i]):
        pixels = (images[i] * 255).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()  # (H, W, 3)
        again = jpeg_round_trip(pixels, quality=quality[i])
        out[i] = torch.from_numpy(again.copy()).permute(2, 0, 1).to(images.dtype) / 255
    return out


def random_rotation(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Turn each image about its centre by its own angle, uniform in [0, 360) degrees (bilinear, zero fill).

    Args:
        images: ``(B, C, H, W)`` floating point.
        generator: the source of the angles, drawn on its device (so a seed gives the same batch on CPU and GPU).

    Returns:
        ``(B, C, H, W)``, same dtype and device: ``rotate_images(images, angles)`` of ``training/data/rot_mnist.py``.
    """
    from .rot_mnist import rotate_images

    if images.ndim != 4:
        raise ValueError(f"images must be (B, C, H, W), got shape {tuple(images.shape)}")
    angles = 360 * torch.rand(images.shape[0], generator=generator, device=generator.device, dtype=torch.float64)
    return rotate_images(images, angles.to(images.device))


def redraw_rotation(upright: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Draw each upright digit again as rot-MNIST draws its digits: a uniform angle, bilinear, rounded to 8 bits.

    Args:
        upright: ``(B, C, H, W)`` floating point in [0, 1], the digits before any rotation
            (``ArraySplit.get_upright``).
        generator: the source of the angles, as for ``random_rotation``.

    Returns:
        ``(B, C, H, W)`` in [0, 1] on the 1/255 grid, same dtype and device.
    """
    turned = random_rotation(upright * 255, generator)
    return turned.round().clamp(0, 255) / 255
