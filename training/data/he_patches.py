"""Patches of the H&E demonstration set: which grid patches of an image are kept, and which split each falls in.

The rules (tissue and ink, blocks, the search for a balanced assignment of blocks to splits) are described in
:mod:`training.data.he_demo`; :class:`HEDemoConfig` holds their numbers. Per image the builder calls
:func:`tile_image`, then :func:`choose_blocks` once over all images, then :func:`cut_patches`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.stain import INK_MARGIN, TISSUE_OD, ink_mask, rgb_to_hed, tissue_mask

__all__ = ["HEDemoConfig", "tile_image", "choose_blocks", "cut_patches"]


@dataclass(frozen=True)
class HEDemoConfig:
    """How patches are cut, kept, split and labelled; the defaults make the published set.

    Attributes:
        patch, centre: patch side and the side of the central region that decides the label (PCam: 96, 32).
        stride: grid step between patches, in pixels at ``target_mpp``.
        target_mpp: resolution of the patches, microns per pixel.
        tissue_od: a pixel is tissue when its largest optical density over R, G, B exceeds this.
        min_tissue, min_centre_tissue: fractions of tissue pixels a kept patch needs, whole and centre.
        ink_margin: a tissue pixel is marking ink (blue-green, as on CMU-1) when its G and B both exceed its R
            by more than this (0..255 scale); ink is not counted as tissue.
        max_centre_ink: most ink a kept patch may have in its centre (ink there would raise the haematoxylin score).
        block: an image is cut into ``side // block`` near-equal blocks per side for splitting (block >= patch).
        fractions: target shares of kept patches for train, valid, test.
        candidates: random assignments of blocks to splits tried per image.
    """

    patch: int = 96
    centre: int = 32
    stride: int = 12
    target_mpp: float = 1.0
    tissue_od: float = TISSUE_OD
    min_tissue: float = 0.5
    min_centre_tissue: float = 0.5
    ink_margin: int = INK_MARGIN
    max_centre_ink: float = 0.02
    block: int = 192
    fractions: tuple[float, float, float] = (0.70, 0.15, 0.15)
    candidates: int = 1024

    def __post_init__(self):
        if not 0 < self.centre <= self.patch or (self.patch - self.centre) % 2:
            raise ValueError(f"centre {self.centre} must fit in the middle of patch {self.patch}")
        if self.stride < 1 or self.block < self.patch:
            raise ValueError(f"stride must be >= 1 and block >= patch, got stride {self.stride}, block {self.block}")

    @property
    def margin(self) -> int:
        """Offset of the central region from the patch's top-left corner, along each axis."""
        return (self.patch - self.centre) // 2


def _edges(length: int, block: int) -> np.ndarray:
    """Edges ``(K + 1,)`` of K = length // block near-equal blocks covering ``[0, length)`` (K >= 1)."""
    k = max(1, length // block)
    return np.round(np.linspace(0, length, k + 1)).astype(np.int64)


def _block_shape(tiles: dict) -> tuple[int, int]:
    """Rows and columns of the block grid of one tiled image."""
    return len(tiles["edges_y"]) - 1, len(tiles["edges_x"]) - 1


def _grid(length: int, cfg: HEDemoConfig) -> np.ndarray:
    return np.arange(0, length - cfg.patch + 1, cfg.stride, dtype=np.int64)


def _box_counts(integral: np.ndarray, y: np.ndarray, x: np.ndarray, side: int) -> np.ndarray:
    """Sum of a mask over the ``side``-square at each (y, x), from its integral image ``(H + 1, W + 1)``."""
    return integral[y + side, x + side] - integral[y, x + side] - integral[y + side, x] + integral[y, x]


def tile_image(rgb: np.ndarray, cfg: HEDemoConfig) -> dict:
    """Every grid patch of one resampled image ``(H, W, 3)`` that passes the tissue and ink rules, with its score.

    Returns:
        ``x``, ``y``: ``(N,)`` top-left corners of the kept patches; ``score``: ``(N,)`` mean haematoxylin of
        their centres; ``corners``: ``(4, N)`` index of the block under each patch corner; ``edges_x``,
        ``edges_y``: block edges; ``tissue_fraction``: share of the image that is tissue.
    """
    height, width = rgb.shape[:2]
    stained = tissue_mask(rgb, cfg.tissue_od)
    ink = stained & ink_mask(rgb, cfg.ink_margin)
    tissue = stained & ~ink
    integral = np.zeros((2, height + 1, width + 1), dtype=np.int64)
    integral[:, 1:, 1:] = np.stack([tissue, ink]).cumsum(1).cumsum(2)  # (tissue, ink) integral images
    grid_y, grid_x = np.meshgrid(_grid(height, cfg), _grid(width, cfg), indexing="ij")
    y, x = grid_y.ravel(), grid_x.ravel()
    margin = cfg.margin
    whole = _box_counts(integral[0], y, x, cfg.patch) >= cfg.min_tissue * cfg.patch**2
    centre = _box_counts(integral[0], y + margin, x + margin, cfg.centre) >= cfg.min_centre_tissue * cfg.centre**2
    clean = _box_counts(integral[1], y + margin, x + margin, cfg.centre) <= cfg.max_centre_ink * cfg.centre**2
    y, x = y[whole & centre & clean], x[whole & centre & clean]
    hem = rgb_to_hed(rgb)[..., 0]
    # Centre means by slicing, not an integral image, so that identical centres get identical scores.
    score = np.array(
        [
            hem[b + margin : b + margin + cfg.centre, a + margin : a + margin + cfg.centre].mean()
            for a, b in zip(x, y, strict=True)
        ],
        dtype=np.float64,
    )
    edges_y, edges_x = _edges(height, cfg.block), _edges(width, cfg.block)
    columns = len(edges_x) - 1
    # A block is at least a patch wide, so a patch touches at most the 2x2 blocks under its corners.
    top, bottom = (np.searchsorted(edges_y, v, side="right") - 1 for v in (y, y + cfg.patch - 1))
    left, right = (np.searchsorted(edges_x, v, side="right") - 1 for v in (x, x + cfg.patch - 1))
    corners = np.stack([top * columns + left, top * columns + right, bottom * columns + left, bottom * columns + right])
    return {
        "x": x,
        "y": y,
        "score": score,
        "corners": corners,
        "edges_x": edges_x,
        "edges_y": edges_y,
        "tissue_fraction": float(tissue.mean()),
    }


def _patch_splits(block_splits: np.ndarray, corners: np.ndarray) -> np.ndarray:
    """``(N,)`` split of each patch, or -1 where its corners fall in blocks of different splits."""
    under = block_splits[corners]  # (4, N)
    return np.where((under == under[0]).all(axis=0), under[0], -1)


def _draw_assignments(tiles: dict, cfg: HEDemoConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """``cfg.candidates`` random block splits (0 train, 1 valid, 2 test) of one image, each ``(n_blocks,)``.

    Of the blocks that hold patches, ``fractions[1]`` go to valid and ``fractions[2]`` to test (at least one
    each); an image with fewer than three such blocks has one candidate, all train.
    """
    rows, columns = _block_shape(tiles)
    n_blocks = rows * columns
    blocks = np.unique(tiles["corners"])
    if len(blocks) < 3:
        return [np.zeros(n_blocks, dtype=np.int64)]
    n_valid = max(1, round(len(blocks) * cfg.fractions[1]))
    n_test = max(1, round(len(blocks) * cfg.fractions[2]))
    candidates = []
    for _ in range(cfg.candidates):
        splits = np.zeros(n_blocks, dtype=np.int64)
        chosen = blocks[rng.permutation(len(blocks))[: n_valid + n_test]]
        splits[chosen[:n_valid]], splits[chosen[n_valid:]] = 1, 2
        candidates.append(splits)
    return candidates


def choose_blocks(tiles: list[dict], cfg: HEDemoConfig, seed: int) -> list[np.ndarray]:
    """Block splits of every image: per image, the candidate of lowest cost given the others' current choice.

    The cost of a candidate is the distance of the image's split shares of patches from ``cfg.fractions``
    plus, for valid and test, the distance of their shares of patches above the threshold (the median of
    all images' training patches under this choice) from one half. Two passes over the images, starting
    from all train, so that each image sees the others' final choice once.

    Args:
        tiles: :func:`tile_image` of every image, in order.
        cfg: the fractions and the number of candidates.
        seed: with the image's index, seeds its draw of candidates.

    Returns:
        Per image, ``(n_blocks,)`` split of every block (0 train, 1 valid, 2 test), blocks in row-major order.
    """
    candidates = [_draw_assignments(t, cfg, np.random.default_rng([seed, i])) for i, t in enumerate(tiles)]
    chosen = [np.zeros_like(c[0]) for c in candidates]
    target = np.asarray(cfg.fractions) / sum(cfg.fractions)
    for _ in range(2):
        for i, tile in enumerate(tiles):
            if len(candidates[i]) == 1:
                chosen[i] = candidates[i][0]
                continue
            others = [t["score"][_patch_splits(chosen[j], t["corners"]) == 0] for j, t in enumerate(tiles) if j != i]
            best_cost = np.inf
            for splits in candidates[i]:
                split = _patch_splits(splits, tile["corners"])
                counts = np.bincount(split[split >= 0], minlength=3)
                if counts.min() == 0:
                    continue
                threshold = np.median(np.concatenate([tile["score"][split == 0], *others]))
                rich = tile["score"] > threshold
                balance = sum(abs(rich[split == s].mean() - 0.5) for s in (1, 2))
                cost = np.abs(counts / counts.sum() - target).sum() + balance
                if cost < best_cost:
                    chosen[i], best_cost = splits, cost
    return chosen


def cut_patches(rgb: np.ndarray, tiles: dict, block_splits: np.ndarray, cfg: HEDemoConfig) -> dict:
    """Cut the patches of one image that lie inside one split, given the split of every block.

    Returns:
        ``x``, ``y``, ``split``, ``score``: ``(N,)`` per patch; ``patches``: uint8 ``(N, patch, patch, 3)``;
        ``block_splits``: one string of split digits per row of blocks, for ``dataset.json``.
    """
    rows, columns = _block_shape(tiles)
    split = _patch_splits(block_splits, tiles["corners"])
    inside = split >= 0
    x, y = tiles["x"][inside], tiles["y"][inside]
    patches = np.zeros((len(x), cfg.patch, cfg.patch, 3), dtype=np.uint8)
    for i, (a, b) in enumerate(zip(x, y, strict=True)):
        patches[i] = rgb[b : b + cfg.patch, a : a + cfg.patch]
    return {
        "x": x,
        "y": y,
        "split": split[inside],
        "score": tiles["score"][inside],
        "patches": patches,
        "block_splits": ["".join(str(v) for v in row) for row in block_splits.reshape(rows, columns)],
    }
