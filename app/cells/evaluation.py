"""The cells of a region or a slide: tumour probability and first-layer attention, cell by cell (region mode's
rule, which the slide engine runs a chunk at a time).

Geometry. PCam's label refers to the central 32 x 32 pixels of a 96 x 96 patch. A region, resampled to the
model's micrometres per pixel, is cut into a grid of 32 x 32 *cells*; cell (i, j) is judged in its 96 x 96
*context* (the cell and 32 pixels around it), exactly as a PCam patch is. The grid is centred in the region,
and the region's sides at the model's scale are made even, so that a quarter turn or a mirror of the region
maps the grid onto itself. Cells whose centre is mostly glass are not evaluated (:func:`cell_tissue`).

Two ways to evaluate (``method``):

* ``"crops"``: every cell's 96 x 96 context through the network, batched: the model's own function, cell by cell.
* ``"tiles"``: the network's trunk once over a tile of cells with its 32-pixel margin. A fully convolutional
  network gives one logit vector per ``output_stride`` (16) pixels; a cell's logits are the mean over its
  2 x 2 positions and the orientations, as the network's final mean is for one patch. Shared computation is
  done once, about 9 times less work. Without attention the two ways are one function (valid convolutions,
  pooling at even offsets), up to round-off. With alpha_F attention they are not: its channel attention
  pools over the whole tile instead of one context, and its padded spatial filters see the neighbouring tissue
  instead of zeros. ``python -m benchmarks.region`` measures by how much the probabilities differ: for the shipped
  attentive model, to chance. The page and the CLI therefore offer only :func:`exact_methods`.

Tiles are laid out as a palindrome (their sizes read the same from either end), so that the partition, too,
maps onto itself under quarter turns and mirrors: in both ways the heatmap of g.region is g.heatmap(region)
to round-off. Memory is bounded by one tile (or one batch of crops), whatever the region's size.

Run ``python -m app.region IMAGE --mpp 0.5 --out heatmap.png --npz cells.npz`` for batch use (:mod:`app.region.cli`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F

from models import Network
from models.attention.parts import READINGS, AttentiveLayer
from models.stain import TISSUE_OD, optical_density

from ..analysis.frames import InputFrame
from ..analysis.pathology import CENTRE, is_pathology, model_microns_per_pixel
from ..analysis.reductions import reduce_readings

__all__ = ["RegionError", "RegionGrid", "RegionResult", "MAX_SIDE", "MPP_RANGE", "TISSUE_SHARE", "METHODS",
           "check_region", "to_model_scale", "make_grid", "tile_spans", "cell_tissue", "evaluate_region",
           "evaluate_cells", "default_method", "exact_methods", "inexact_method", "TILES_AT_CHANCE",
           "first_attentive_layer", "READINGS", "DEFAULT_READING"]

MAX_SIDE = 4096  # pixels, of the region as given and at the model's scale
MPP_RANGE = (0.05, 20.0)  # micrometres per pixel: from beyond 100x objectives to heavily downsampled slide levels
TISSUE_SHARE = 0.05  # a cell is evaluated when at least this share of its pixels is stained tissue
METHODS = ("tiles", "crops")
DEFAULT_READING = "spatial"  # alpha_s, what the paper's figures draw (models.attention.parts.READINGS)
# Why "tiles" is not offered for a model with attention, as measured (docs/region.md, "Exact or fast": the tests
# check that it still gives these numbers).
TILES_AT_CHANCE = ("On the PCam test mosaic the shipped fa_p4m_densenet_pcam scores AUC 0.458 with tiles (chance) "
                   "against 0.956 with crops (docs/region.md).")
Progress = Callable[[int, int], None]


class RegionError(ValueError):
    """A region, scale or model that region mode cannot use; the message is meant for the user."""


# Contexts per forward pass ("crops"). On the 2-core AMD EPYC (AVX2), the PCam DenseNet over one chunk's 64 cells,
# one PyTorch thread: 3.3-3.5 s at 8 against 4.0 s at 16 alone, 3.0-3.5 s against 2.8-3.5 s with a second process
# beside it; the peak memory 163 MB above the model against 255 MB at 16 (a slide's worker keeps its largest pass's
# memory, per thread). Results differ by round-off (3e-9 in P(tumour)).
BATCH = 8


@dataclass(frozen=True)
class RegionGrid:
    """Cells of ``cell`` x ``cell`` pixels, each judged in its ``context`` x ``context`` window.

    Attributes:
        rows, cols: number of cells.
        top, left: the first cell's context starts at this pixel of the image at the model's scale.
    """

    rows: int
    cols: int
    top: int
    left: int
    cell: int = CENTRE
    context: int = 96

    @property
    def margin(self) -> int:
        return (self.context - self.cell) // 2

    def context_origin(self, i: int, j: int) -> tuple[int, int]:
        """Top-left pixel of cell (i, j)'s context."""
        return self.top + i * self.cell, self.left + j * self.cell

    def cell_origin(self, i: int, j: int) -> tuple[int, int]:
        """Top-left pixel of cell (i, j) itself."""
        row, col = self.context_origin(i, j)
        return row + self.margin, col + self.margin

    def cell_at(self, row: float, col: float) -> tuple[int, int] | None:
        """The cell holding pixel (row, col) of the image at the model's scale, or None outside the grid."""
        i = math.floor((row - self.top - self.margin) / self.cell)
        j = math.floor((col - self.left - self.margin) / self.cell)
        return (i, j) if 0 <= i < self.rows and 0 <= j < self.cols else None


@dataclass(frozen=True)
class RegionResult:
    """One region through one model.

    Attributes:
        image: ``(3, H, W)`` float32 in [0, 1]: the region at the model's scale, what the network saw.
        grid: the cells.
        tissue: ``(rows, cols)`` share of each cell's pixels that are stained tissue.
        evaluated: ``(rows, cols)`` bool, the cells with enough tissue.
        probabilities: ``(rows, cols, classes)`` float64; NaN where not evaluated.
        attentions: reading -> ``(H, W)`` float32, the first attentive layer's attention from the same forward
            passes: ``"removed"`` (alpha-) and, where it has spatial attention, ``"spatial"`` (alpha_s, the
            paper's pictures); ``"kept"`` (alpha+ = 1 - alpha-) is derived when shown, so that a large region's
            result holds two maps, not three. Each is the mean over the layer's orientations: each evaluated
            cell's centre from its own computation; a pixel in no evaluated cell but in evaluated cells' contexts
            (glass at the tissue's edge, a mosaic's patch around its centre), the mean over those contexts; NaN
            elsewhere. Empty for a model without attention.
        attention_layer: that layer's name ("" without attention).
        reading: the reading :attr:`attention` shows (:meth:`in_reading` gives another at no cost).
        class_names: one per class.
        method: ``"tiles"`` or ``"crops"``.
        microns_per_pixel: of the region as given; ``model_microns_per_pixel``: of ``image``.
        seconds: wall time of the evaluation.
    """

    image: np.ndarray
    grid: RegionGrid
    tissue: np.ndarray
    evaluated: np.ndarray
    probabilities: np.ndarray
    attentions: Mapping[str, np.ndarray]
    attention_layer: str
    class_names: tuple[str, ...]
    method: str
    microns_per_pixel: float
    model_microns_per_pixel: float
    seconds: float
    reading: str = DEFAULT_READING

    @property
    def readings(self) -> tuple[str, ...]:
        """The readings this result can show (:data:`models.attention.parts.READINGS` order); none without attention."""
        return tuple(r for r in READINGS if r == "kept" and "removed" in self.attentions or r in self.attentions)

    @property
    def attention(self) -> np.ndarray | None:
        """``(H, W)``: the attention in :attr:`reading`; None for a model without attention."""
        if not self.attentions:
            return None
        return 1 - self.attentions["removed"] if self.reading == "kept" else self.attentions[self.reading]

    def in_reading(self, reading: str) -> RegionResult:
        """The same evaluation shown in ``reading``.

        Raises:
            RegionError: a reading the attention layer does not have (``"spatial"`` without spatial attention).
        """
        if self.attentions and reading not in self.readings:
            raise RegionError(f"layer {self.attention_layer} has no {reading!r} reading: its attention has no "
                              f"spatial map (readings: {', '.join(self.readings)})")
        return replace(self, reading=reading)

    @property
    def positive(self) -> np.ndarray:
        """``(rows, cols)`` probability of the last class (PCam: tumour); NaN where not evaluated."""
        return self.probabilities[..., -1]

    def context(self, i: int, j: int) -> np.ndarray:
        """``(3, 96, 96)``: cell (i, j) in its context, as the network saw it in ``"crops"``."""
        row, col = self.grid.context_origin(i, j)
        size = self.grid.context
        return np.ascontiguousarray(self.image[:, row:row + size, col:col + size])


def check_region(image: np.ndarray, microns_per_pixel: float | None, card: dict,
                 model: Network | None = None, method: str = "tiles") -> float:
    """Raise :class:`RegionError` for what region mode cannot use; return the model's micrometres per pixel."""
    if not is_pathology(card):
        raise RegionError("Region mode needs an H&E patch model (PCam); this model's card names another dataset.")
    model_mpp = model_microns_per_pixel(card)
    if model_mpp is None:
        raise RegionError("The model card does not say at what micrometres per pixel the model was trained.")
    if method not in METHODS:
        raise RegionError(f"method must be one of {METHODS}, got {method!r}")
    if model is not None and method == "tiles" and not model.output_stride:
        raise RegionError(f"{model.arch} is not fully convolutional: use method 'crops'.")
    if image.ndim != 3 or image.shape[0] != 3:
        what = "a grey image" if image.ndim == 3 and image.shape[0] == 1 else f"an array of shape {image.shape}"
        raise RegionError(f"Region mode needs an RGB H&E image; this is {what}.")
    rows, cols = image.shape[1:]
    if max(rows, cols) > MAX_SIDE:
        raise RegionError(f"The region is {rows} x {cols} pixels; region mode takes at most {MAX_SIDE} x "
                          f"{MAX_SIDE}. Crop it or export a lower-resolution level.")
    if microns_per_pixel is None:
        raise RegionError("Give the region's micrometres per pixel (your scanner's or slide level's: 0.25 at "
                          "40x, 0.5 at 20x, 1.0 at 10x).")
    mpp = float(microns_per_pixel)
    low, high = MPP_RANGE
    if not (math.isfinite(mpp) and low <= mpp <= high):
        raise RegionError(f"{microns_per_pixel} um/px is not a plausible scale for a histology image; give a value "
                          f"between {low} and {high}.")
    side = max(_scaled_side(rows, mpp / model_mpp), _scaled_side(cols, mpp / model_mpp))
    if side > MAX_SIDE:
        raise RegionError(f"At the model's {model_mpp} um/px the region would be {side} pixels wide (more than "
                          f"{MAX_SIDE}); give a smaller region.")
    if min(_scaled_side(rows, mpp / model_mpp), _scaled_side(cols, mpp / model_mpp)) < 96:
        raise RegionError(f"At the model's {model_mpp} um/px the region is smaller than one 96 x 96 patch.")
    return model_mpp


def _scaled_side(n: int, scale: float) -> int:
    """A side of n pixels at ``scale`` times the resolution, rounded to an even number (so the grid centres)."""
    return max(2, 2 * round(n * scale / 2)) if scale != 1 or n % 2 else n


def to_model_scale(image: np.ndarray, microns_per_pixel: float, model_microns_per_pixel: float) -> np.ndarray:
    """``(3, H, W)`` in [0, 1] -> the same region at the model's scale, float32, sides even.

    Antialiased bilinear resampling (``torch.nn.functional.interpolate``, in float64), whose weights are symmetric,
    so that resampling commutes with quarter turns and mirrors up to round-off. An image already at the model's scale
    with even sides is returned as it is; an odd side is stretched by one pixel.
    """
    scale = microns_per_pixel / model_microns_per_pixel
    rows, cols = image.shape[1:]
    size = (_scaled_side(rows, scale), _scaled_side(cols, scale))
    pixels = np.ascontiguousarray(image, dtype=np.float32)
    if size == (rows, cols):
        return pixels
    # In float64: the sums of a turned image run in another order, and float32 round-off (5e-6 here) would reach
    # the probabilities as 1e-5; float64's is far below what float32 keeps.
    resized = F.interpolate(torch.from_numpy(pixels).double()[None], size=size, mode="bilinear", align_corners=False,
                            antialias=True)[0]
    return resized.clamp_(0, 1).float().numpy()


def make_grid(rows: int, cols: int, cell: int = CENTRE, context: int = 96) -> RegionGrid:
    """The largest grid of cells whose contexts fit, centred (exactly, for even sides)."""
    if min(rows, cols) < context:
        raise RegionError(f"The region ({rows} x {cols} at the model's scale) is smaller than one {context} x "
                          f"{context} context.")
    n_rows, n_cols = (rows - context) // cell + 1, (cols - context) // cell + 1
    used_rows, used_cols = (n_rows - 1) * cell + context, (n_cols - 1) * cell + context
    return RegionGrid(n_rows, n_cols, (rows - used_rows) // 2, (cols - used_cols) // 2, cell, context)


def tile_spans(n: int, tile: int) -> list[tuple[int, int]]:
    """``(start, length)`` of tiles covering ``n`` cells, at most ``tile`` long, lengths a palindrome.

    An odd number of tiles, the longer ones placed in pairs from both ends (and in the middle for an odd
    remainder), so that reversing the cells reverses the tiles.
    """
    count = max(1, math.ceil(n / tile))
    count += 1 - count % 2  # odd
    base, extra = divmod(n, count)
    lengths = [base] * count
    for k in range(extra // 2):
        lengths[k] += 1
        lengths[count - 1 - k] += 1
    if extra % 2:
        lengths[count // 2] += 1
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return [(int(s), int(length)) for s, length in zip(starts, lengths, strict=True) if length > 0]


def cell_tissue(image: np.ndarray, grid: RegionGrid, od_threshold: float = TISSUE_OD) -> np.ndarray:
    """``(rows, cols)``: the share of each cell's pixels that are stained (largest optical density > threshold).

    Pixel by pixel, then counted per cell: exact under the group, as the grid is.
    """
    stained = optical_density(np.moveaxis(image, 0, -1) * 255.0).max(axis=-1) > od_threshold  # (H, W)
    top, left = grid.cell_origin(0, 0)
    block = stained[top:top + grid.rows * grid.cell, left:left + grid.cols * grid.cell]
    return block.reshape(grid.rows, grid.cell, grid.cols, grid.cell).mean(axis=(1, 3))


def first_attentive_layer(model: Network) -> str:
    """Name of the network's first attentive layer in forward order ("" when it has none)."""
    return next((name for name, module in model.named_modules() if isinstance(module, AttentiveLayer)), "")


def default_method(model: Network) -> str:
    """``"tiles"`` where it is the model's own function (fully convolutional, no attention), else ``"crops"``."""
    return "tiles" if model.output_stride and not first_attentive_layer(model) else "crops"


def exact_methods(model: Network) -> tuple[str, ...]:
    """The methods that compute the model's own function, cell by cell (:data:`METHODS` order): what the page and
    the CLI offer. ``"crops"`` always; ``"tiles"`` only where it is the default (no attention, fully convolutional)."""
    return METHODS if default_method(model) == "tiles" else ("crops",)


def inexact_method(model: Network, method: str, name: str) -> str:
    """Why ``method`` is not the function of model ``name`` (for the user, with the measured cost); "" where it is.

    Only ``"tiles"`` on an attentive model: its attention would pool over a whole tile instead of one context.
    :func:`evaluate_region` still runs it (``benchmarks.region`` measures the disagreement); the page and the CLI
    do not.
    """
    if method != "tiles" or not model.output_stride or not first_attentive_layer(model):
        return ""  # the model's function, or (tiles without a fully convolutional trunk) refused by check_region
    return (f"The shared trunk over tiles is not {name}'s function: its attention would pool over a whole tile, "
            f"not each cell's 96 x 96 context. {TILES_AT_CHANCE}")


def evaluate_region(
    model: Network, card: dict, image: np.ndarray, microns_per_pixel: float | None, *,
    method: str = "crops", tile_cells: int = 15, batch: int = BATCH, progress: Progress | None = None,
    cells: np.ndarray | None = None, reading: str = DEFAULT_READING,
) -> RegionResult:
    """Tumour probability per cell and the first attention layer's map over a region.

    Args:
        model: a registered H&E network in eval mode; it is only read.
        card: its model card (scale from ``input.microns_per_pixel`` or the dataset, normalisation from ``input``).
        image: ``(3, H, W)`` float in [0, 1], at most :data:`MAX_SIDE` pixels a side.
        microns_per_pixel: the region's scale.
        method: ``"crops"`` (every context alone, the model's function) or ``"tiles"`` (shared trunk: the same
            function only without attention, see :func:`default_method` and the module docstring).
        tile_cells: longest tile side, in cells (``"tiles"``).
        batch: contexts per forward pass (``"crops"``).
        progress: called with (done, total) after each forward pass.
        cells: ``(rows, cols)`` bool, the cells to evaluate instead of those with tissue (e.g. the labelled cells of
            a mosaic of patches).
        reading: the reading :attr:`RegionResult.attention` shows (:data:`READINGS`); every reading the layer
            has is computed all the same, from the same forward passes.

    Raises:
        RegionError: a region, scale or model region mode cannot use, a region without tissue, or a reading the
            attention layer does not have (``"spatial"`` without spatial attention).
    """
    if model.training:
        raise ValueError("evaluate_region needs a model in eval mode")
    if reading not in READINGS:
        raise RegionError(f"reading must be one of {READINGS}, got {reading!r}")
    model_mpp = check_region(image, microns_per_pixel, card, model, method)
    start = time.perf_counter()
    scaled = to_model_scale(image, float(microns_per_pixel), model_mpp)
    grid = make_grid(*scaled.shape[1:], context=int(card["input"]["size"]))
    tissue = cell_tissue(scaled, grid)
    evaluated = tissue >= TISSUE_SHARE
    if cells is not None:
        if cells.shape != evaluated.shape:
            raise ValueError(f"cells has shape {cells.shape}, the grid {evaluated.shape}")
        evaluated = cells.astype(bool)
    if not evaluated.any():
        raise RegionError(f"No tissue found: no 32 x 32 cell of the region is {TISSUE_SHARE:.0%} stained (optical "
                          f"density above {TISSUE_OD}). Is it a blank or a non-H&E image?")
    layer = first_attentive_layer(model)
    probabilities, attentions = evaluate_cells(model, card, scaled, grid, evaluated, method=method,
                                               tile_cells=tile_cells, batch=batch, progress=progress)
    return RegionResult(
        image=scaled, grid=grid, tissue=tissue, evaluated=evaluated, probabilities=probabilities,
        attentions=attentions, attention_layer=layer,
        class_names=tuple(card.get("class_names") or [str(k) for k in range(probabilities.shape[-1])]),
        method=method, microns_per_pixel=float(microns_per_pixel), model_microns_per_pixel=model_mpp,
        seconds=time.perf_counter() - start,
    ).in_reading(reading)


def evaluate_cells(model: Network, card: dict, scaled: np.ndarray, grid: RegionGrid, evaluated: np.ndarray, *,
                   method: str = "crops", tile_cells: int = 15, batch: int = BATCH,
                   progress: Progress | None = None,
                   dtype: torch.dtype | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The ``evaluated`` cells of ``grid`` over ``scaled`` (an image at the model's scale) through ``model``: the
    one place that runs the network over cells, for a region (:func:`evaluate_region`) and for a chunk of a slide's
    cells (:mod:`app.slides.engine`). ``dtype``: the precision the network runs in (:mod:`models.precision`: a
    bfloat16 input runs its bfloat16 path), by default its weights' own.

    Returns:
        ``(rows, cols, classes)`` probabilities (NaN where not evaluated), and per reading the first attentive
        layer's map over ``scaled`` (:attr:`RegionResult.attentions`; empty without attention).
    """
    runner = _Runner(model, card, scaled, grid, first_attentive_layer(model), dtype)
    if method == "tiles":
        blocks = [(r, c) for r in tile_spans(grid.rows, tile_cells) for c in tile_spans(grid.cols, tile_cells)
                  if evaluated[r[0]:r[0] + r[1], c[0]:c[0] + c[1]].any()]
        for done, (rows, cols) in enumerate(blocks, 1):
            runner.run_tile(rows, cols)
            if progress:
                progress(done, len(blocks))
    else:
        cells = np.argwhere(evaluated)
        for done, first in enumerate(range(0, len(cells), batch), 1):
            runner.run_crops(cells[first:first + batch])
            if progress:
                progress(done, math.ceil(len(cells) / batch))
    probabilities = runner.probabilities()
    probabilities[~evaluated] = np.nan
    return probabilities, _stitched_attention(runner, grid, evaluated)


def _stitched_attention(runner: _Runner, grid: RegionGrid, evaluated: np.ndarray) -> dict[str, np.ndarray]:
    """Per reading: the centres of evaluated cells, and elsewhere the mean over the evaluated contexts that cover
    a pixel."""
    if runner.covered is None:
        return {}
    top, left = grid.cell_origin(0, 0)
    centres = np.zeros(runner.covered.shape, dtype=bool)
    centres[top:top + grid.rows * grid.cell, left:left + grid.cols * grid.cell] = np.kron(
        evaluated, np.ones((grid.cell, grid.cell), dtype=bool))
    stitched = {}
    for reading, attention in runner.attention.items():
        with np.errstate(invalid="ignore", divide="ignore"):
            around = np.where(runner.covered > 0, runner.context_sum[reading] / runner.covered, np.nan)
        stitched[reading] = np.where(centres, attention, around).astype(np.float32)
    return stitched


class _Runner:
    """Forward passes over contexts and tiles, collecting per-cell logits and the stitched attention."""

    def __init__(self, model: Network, card: dict, image: np.ndarray, grid: RegionGrid, layer: str,
                 dtype: torch.dtype | None = None):
        self.model, self.image, self.grid, self.layer = model, image, grid, layer
        self.frame = InputFrame.from_card(card, model.group)
        self.dtype = dtype or next(model.parameters()).dtype
        # The model's device (a slide worker's GPU, app.slides.workers): contexts go there, results come back.
        self.device = next(model.parameters()).device
        self.logits: np.ndarray | None = None  # (rows, cols, classes), made at the first result
        # Per reading, made at the first result: the centres' maps, and every context's whole map summed.
        self.attention: dict[str, np.ndarray] = {}
        self.context_sum: dict[str, np.ndarray] = {}
        # How many contexts covered each pixel: a mean where no centre is.
        self.covered = np.zeros(image.shape[1:], dtype=np.uint8) if layer else None

    def _forward(self, contexts: np.ndarray) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None]:
        """``(B, 3, X, Y)`` -> cell logits ``(B, rows, cols, classes)`` and, per reading, attention ``(B, X, Y)``
        (or None)."""
        # Normalised in float32 at least, then rounded once to a bfloat16 network's input.
        exact = torch.float32 if self.dtype == torch.bfloat16 else self.dtype
        x = self.frame.to_network(torch.from_numpy(contexts).to(exact)).to(self.device, self.dtype)
        with torch.inference_mode():
            if self.model.output_stride:
                logits, trace = self.model.position_logits(x, record=(self.layer,) if self.layer else ())
                per_cell = self.grid.cell // self.model.output_stride
                if logits.dim() == 5:
                    logits = logits.mean(dim=2)  # (B, classes, X', Y'): mean over orientations
                b, k, rows, cols = logits.shape
                cells = logits.reshape(b, k, rows // per_cell, per_cell, cols // per_cell, per_cell).mean(dim=(3, 5))
                cells = cells.permute(0, 2, 3, 1)  # (B, rows, cols, classes)
            else:
                out, trace = self.model.trace(x)
                cells = out[:, None, None, :]
            attention = None
            if self.layer:
                parts = trace.attention[self.layer]
                # The readings in float64 on the CPU, wherever the model ran (the frame's permutations are there).
                parts = replace(parts, channel=None if parts.channel is None else parts.channel.cpu(),
                                spatial=None if parts.spatial is None else parts.spatial.cpu())
                user = self.frame.attention_to_user(parts)
                # (B, X, Y) per reading: the mean over orientations; alpha+ = 1 - alpha- is derived when shown.
                attention = {reading: maps.mean(dim=1).float() for reading, maps in reduce_readings(user).items()
                             if reading != "kept"}
        return cells.double().cpu(), attention

    def _store(self, cells: torch.Tensor, attention: dict[str, np.ndarray] | None, i: int, j: int) -> None:
        """One context's or tile's results, its first cell being (i, j); attention: ``(X, Y)`` per reading."""
        rows, cols, classes = cells.shape
        if self.logits is None:
            self.logits = np.full((self.grid.rows, self.grid.cols, classes), np.nan)
        self.logits[i:i + rows, j:j + cols] = cells.numpy()
        if attention is None or self.covered is None:
            return
        m, c = self.grid.margin, self.grid.cell
        top, left = self.grid.cell_origin(i, j)
        context_top, context_left = self.grid.context_origin(i, j)
        for reading, values in attention.items():
            if values.shape[-2:] != (rows * c + 2 * m, cols * c + 2 * m):
                raise RegionError(f"layer {self.layer}'s attention is not at the input's resolution: cannot stitch")
            if reading not in self.attention:
                self.attention[reading] = np.full(self.covered.shape, np.nan, dtype=np.float32)
                self.context_sum[reading] = np.zeros(self.covered.shape, dtype=np.float32)
            self.attention[reading][top:top + rows * c, left:left + cols * c] = values[m:m + rows * c, m:m + cols * c]
            height, width = values.shape[-2:]
            self.context_sum[reading][context_top:context_top + height, context_left:context_left + width] += values
        height, width = next(iter(attention.values())).shape[-2:]
        self.covered[context_top:context_top + height, context_left:context_left + width] += 1

    def run_tile(self, rows: tuple[int, int], cols: tuple[int, int]) -> None:
        (i, n_rows), (j, n_cols) = rows, cols
        top, left = self.grid.context_origin(i, j)
        cell, context = self.grid.cell, self.grid.context
        height, width = (n_rows - 1) * cell + context, (n_cols - 1) * cell + context
        cells, attention = self._forward(self.image[None, :, top:top + height, left:left + width])
        self._store(cells[0], None if attention is None else {r: a[0].numpy() for r, a in attention.items()}, i, j)

    def run_crops(self, cells: np.ndarray) -> None:
        size = self.grid.context
        origins = [self.grid.context_origin(int(i), int(j)) for i, j in cells]
        contexts = np.stack([self.image[:, r:r + size, c:c + size] for r, c in origins])
        logits, attention = self._forward(contexts)
        for k, (i, j) in enumerate(cells):
            self._store(logits[k], None if attention is None else {r: a[k].numpy() for r, a in attention.items()},
                        int(i), int(j))

    def probabilities(self) -> np.ndarray:
        return torch.softmax(torch.from_numpy(self.logits), dim=-1).numpy()
