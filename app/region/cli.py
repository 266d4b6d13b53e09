"""Region mode from the command line: ``python -m app.region IMAGE --mpp 0.5 [options]``.

Reads an H&E region (PNG, JPEG, TIFF, BMP, WebP, or a slide; at most 4096 pixels a side) through slide mode's
reader (:func:`app.slides.reader.open_slide`: 8-bit RGB, EXIF orientation applied), evaluates it cell by cell
with a PCam model (:func:`app.cells.evaluation.evaluate_region`) and writes what was asked for: the tumour probability
over the tissue as a PNG (``--out``), the first attention layer's map as a PNG (``--attention-out``, in the reading
``--reading`` names: ``spatial``, alpha_s as the paper's figures draw it, by default), and the cells as an ``.npz``
(``--npz``). ``--method tiles`` is refused for a model with attention, where it is not the model's function
(at chance on the PCam test mosaic). A short summary goes to stdout, progress to stderr. A region, scale, file or
checkpoint that cannot be used ends with ``error: <message>`` on stderr and exit status 2, no traceback.

Not an alias of ``python -m app.slides IMAGE --mpp X``, which gives the same cells (the same grid, tissue and
probabilities: ``tests/test_slides_cli.py``) but keeps the attention pooled over 4 x 4 pixels and draws over a
thumbnail: this command adds the full-resolution pictures (the probability surface with its 0.5 contour, the
attention map in each reading), the shared trunk over tiles for a model without attention, and one process without
Dask.

The ``.npz`` holds, per cell (``rows x cols``): ``probability`` (of the last class, tumour; NaN where not
evaluated), ``probabilities`` (every class), ``evaluated``, ``tissue`` (share of stained pixels) and
``cell_top_left_px`` (row, column of the cell's top-left corner in the ORIGINAL image's pixels, as pixel-edge
coordinates; ``cell_size_px`` is the cell's side there), and ``microns_per_pixel``,
``model_microns_per_pixel``, ``method``, ``class_names``, ``checkpoint``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from ..analysis.images import FORMATS, ImageError
from ..cells.evaluation import DEFAULT_READING, MAX_SIDE, METHODS, READINGS, RegionError, RegionResult

__all__ = ["main", "build_parser", "DEFAULT_CHECKPOINT", "MAX_FILE_BYTES"]

DEFAULT_CHECKPOINT = "checkpoints/fa_p4m_densenet_pcam.safetensors"
MAX_FILE_BYTES = 200 * 2**20


class _Refused(Exception):
    """Something the CLI itself refuses (a file that cannot be read or written); the message is for the user."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m app.region",
        description="Tumour probability (and first-layer attention) of an H&E region, cell by cell, with a PCam "
                    "model: each 32 x 32 px cell judged in its 96 x 96 context at the model's scale.")
    parser.add_argument("image", metavar="IMAGE", help=f"the region ({', '.join(FORMATS)}, or a slide), at most "
                                                       f"{MAX_SIDE} x {MAX_SIDE} pixels")
    parser.add_argument("--mpp", type=float, required=True,
                        help="micrometres per pixel of IMAGE (0.25 at 40x, 0.5 at 20x, 1.0 at 10x)")
    parser.add_argument("--checkpoint", default=DEFAULT_CHECKPOINT, help=f"model (default: {DEFAULT_CHECKPOINT})")
    parser.add_argument("--method", choices=METHODS, default=None,
                        help="crops: every cell's context alone (the model's own function); tiles: shared "
                             "computation, about 5 times faster, the same function only without attention, and "
                             "refused for a model with attention (default: crops for attention models, else tiles)")
    parser.add_argument("--out", type=Path, help="write the tumour probability heatmap here (PNG)")
    parser.add_argument("--attention-out", type=Path, help="write the attention map here (PNG)")
    parser.add_argument("--reading", choices=READINGS, default=DEFAULT_READING,
                        help="what the attention map shows: kept (alpha+ = 1 - alpha_c alpha_s, what the layer "
                             "multiplies its input by), removed (alpha_c alpha_s = 1 - kept) or spatial (alpha_s, "
                             f"as the paper's figures draw it; default {DEFAULT_READING})")
    parser.add_argument("--npz", type=Path, help="write the per-cell results here (.npz)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's)")
    parser.add_argument("--tile-cells", type=int, default=15, help="longest tile side in cells (tiles; default 15)")
    return parser


def _read_region(path: str) -> np.ndarray:
    """``(3, H, W)`` float32 in [0, 1]: level 0 of the image or slide at ``path``, read as slide mode reads it
    (:func:`app.slides.reader.open_slide`, one reader), refused from its size before its pixels are read where
    region mode could never take it."""
    from ..slides.reader import SlideError, open_slide

    file = Path(path)
    if file.is_file() and file.stat().st_size > MAX_FILE_BYTES:
        raise _Refused(f"{path} has {file.stat().st_size / 2**20:.0f} MB; the limit is "
                       f"{MAX_FILE_BYTES / 2**20:.0f} MB.")
    try:
        with open_slide(file) as slide:
            width, height = slide.dimensions
            if max(width, height) > MAX_SIDE:
                raise RegionError(f"The image is {width} x {height} pixels (width x height); region mode takes at "
                                  f"most {MAX_SIDE} x {MAX_SIDE}. Crop it, export a lower-resolution level, or "
                                  "analyse it whole with python -m app.slides.")
            if not slide.colour:
                raise RegionError("Region mode needs an RGB H&E image; this is a grey image.")
            pixels = slide.read_region(0, 0, 0, width, height)
    except SlideError as err:
        raise _Refused(str(err)) from None
    return np.ascontiguousarray(pixels.transpose(2, 0, 1), dtype=np.float32) / 255.0


def _check_writable(paths: list[Path | None]) -> None:
    """Fail before a long evaluation, not after it, when an output's folder is missing."""
    for path in paths:
        if path is None:
            continue
        if path.is_dir():
            raise _Refused(f"{path} is a folder; give a file name")
        if not path.parent.is_dir():
            raise _Refused(f"cannot write {path}: the folder {path.parent} does not exist")


class _Progress:
    """``progress(done, total)`` for :func:`evaluate_region`, as a tqdm bar on stderr (or plain lines)."""

    def __init__(self, what: str):
        self.what, self.bar = what, None

    def __call__(self, done: int, total: int) -> None:
        try:
            from tqdm import tqdm
        except ImportError:  # not installed: a line every tenth
            if done == total or done % max(1, total // 10) == 0:
                print(f"{self.what}: {done}/{total}", file=sys.stderr, flush=True)
            return
        if self.bar is None:
            self.bar = tqdm(total=total, desc=self.what, file=sys.stderr, mininterval=0.5, leave=True)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def cell_origins_in_source(result: RegionResult, source_shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, cols, 2)`` top-left corners of the cells and ``(2,)`` their side, in the source image's pixels.

    Pixel-edge coordinates: the model-scale image's edges map linearly onto the source's (antialiased bilinear
    resampling without aligned corners), with each axis's own ratio ``source size / model-scale size``, since
    the model-scale sides are rounded to even numbers.
    """
    grid = result.grid
    ratio = np.array(source_shape, dtype=float) / np.array(result.image.shape[1:], dtype=float)
    top, left = grid.cell_origin(0, 0)
    i, j = np.meshgrid(np.arange(grid.rows), np.arange(grid.cols), indexing="ij")
    origins = np.stack([top + i * grid.cell, left + j * grid.cell], axis=-1).astype(float)
    return origins * ratio, grid.cell * ratio


def _summary(result: RegionResult) -> str:
    p = result.positive[result.evaluated]
    count, total = int(result.evaluated.sum()), result.evaluated.size
    name = result.class_names[-1]
    return "\n".join([
        f"cells evaluated: {count} of {total} ({count / total:.0%}; the others have too little tissue)",
        f"P({name}): mean {p.mean():.3f}, max {p.max():.3f}; cells with P > 0.5: {np.mean(p > 0.5):.1%} "
        f"({int(np.sum(p > 0.5))})",
        f"method {result.method}, grid {result.grid.rows} x {result.grid.cols} cells at "
        f"{result.model_microns_per_pixel:g} um/px, {result.seconds:.1f} s",
    ])


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0, or 2 with ``error: ...`` on stderr). Bad arguments exit 2 too."""
    args = build_parser().parse_args(argv)
    import torch

    threads = torch.get_num_threads()
    try:
        return _run(args)
    except (_Refused, ImageError, RegionError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        torch.set_num_threads(threads)  # --threads is this run's: a caller in the same process keeps its own


def _run(args: argparse.Namespace) -> int:
    import torch

    from models import load_checkpoint
    from models.checkpoint import CheckpointError

    from ..cells.evaluation import check_region, default_method, evaluate_region, first_attentive_layer, inexact_method
    from .figures import render_region_png

    if args.threads is not None:
        if args.threads < 1:
            raise _Refused(f"--threads must be at least 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    if args.tile_cells < 1:
        raise _Refused(f"--tile-cells must be at least 1, got {args.tile_cells}")
    _check_writable([args.out, args.attention_out, args.npz])
    image = _read_region(args.image)
    try:
        model, card = load_checkpoint(args.checkpoint)
    except CheckpointError as err:
        raise _Refused(f"cannot load the checkpoint: {err}") from None
    method = args.method or default_method(model)
    check_region(image, args.mpp, card, model, method)
    if reason := inexact_method(model, method, Path(args.checkpoint).stem):
        raise _Refused(f"{reason} Use --method crops, this model's default.")
    if args.attention_out is not None and not first_attentive_layer(model):
        raise _Refused(f"{card.get('arch', 'this model')} has no attention layer: drop --attention-out")

    progress = _Progress(f"evaluating ({method}, {'tiles' if method == 'tiles' else 'batches of cells'})")
    try:
        result = evaluate_region(model, card, image, args.mpp, method=method, tile_cells=args.tile_cells,
                                 progress=progress, reading=args.reading)
    finally:
        progress.close()

    written = []
    try:
        if args.out is not None:
            args.out.write_bytes(render_region_png(result, show="probability"))
            written.append(args.out)
        if args.attention_out is not None:
            args.attention_out.write_bytes(render_region_png(result, show="attention"))
            written.append(args.attention_out)
        if args.npz is not None:
            origins, side = cell_origins_in_source(result, image.shape[1:])
            with open(args.npz, "wb") as handle:  # as given: np.savez would append ".npz" to another suffix
                np.savez_compressed(
                    handle, probability=result.positive, probabilities=result.probabilities,
                    evaluated=result.evaluated, tissue=result.tissue, cell_top_left_px=origins,
                    cell_size_px=side, microns_per_pixel=np.float64(result.microns_per_pixel),
                    model_microns_per_pixel=np.float64(result.model_microns_per_pixel),
                    method=np.str_(result.method), class_names=np.array(result.class_names, dtype=str),
                    checkpoint=np.str_(str(args.checkpoint)))
            written.append(args.npz)
    except OSError as err:
        raise _Refused(f"cannot write {err.filename or 'an output'} ({err.strerror or err})") from None

    print(_summary(result))
    for path in written:
        print(f"wrote {path}")
    return 0
