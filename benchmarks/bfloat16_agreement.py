"""How far bfloat16 moves what the PCam models say: P(tumour), AUC, attention and a slide's tumour regions.

    python -m benchmarks.bfloat16_agreement [--checkpoint PATH] [--limit N] [--threads 2] [--slide PATH]

On the 1,944 test patches of ``../shared/data/pcam_public`` (the card's data_dir), through the evaluator's steps (the
card's normalisation, softmax in float32), once in float32 and once in bfloat16 (the input rounded once after
normalisation, the network's bfloat16 path: :mod:`models.precision`), and on the CMU demo slide's cells through the
slide engine (:func:`app.slides.engine.evaluate_chunk`, every chunk with tissue, in this process). Prints, against
the goals of the bfloat16 path:

* the AUC of each, and their difference (goal: within 0.002);
* max and 99th percentile of |dP(tumour)| per patch (goals: 0.02 and 0.005), and the share of calls at 0.5 that flip;
* the first attentive layer's alpha_s per patch: Spearman's rank correlation of bfloat16's map with float32's over
  the patch's pixels (goal: median at least 0.99), with its 5th percentile and minimum;
* the slide's tumour cells (evaluated, P >= 0.5; the cells of its GeoJSON regions) in bfloat16 against float32:
  intersection over union (goal: at least 0.98).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from app.slides.engine import evaluate_chunk
from app.slides.moved import moved_slide
from app.slides.reader import open_slide
from app.slides.run import plan_slide
from benchmarks.stain import cpu_line
from experiments.patch_records import BATCH_SIZE
from models import load_checkpoint
from models.precision import choose_precision
from training.data import ArraySplit, load_dataset
from training.evaluation import Normaliser
from training.metrics import roc_auc

REPO = Path(__file__).resolve().parents[1]
CHECKPOINT = REPO / "checkpoints" / "fa_p4m_densenet_pcam.safetensors"
SLIDE = REPO.parent / "shared" / "data" / "slides" / "CMU-1-Small-Region.svs"
GOALS = dict(auc=0.002, max_dp=0.02, p99_dp=0.005, spearman=0.99, iou=0.98)


def first_attentive_layer(model) -> str:
    return next(name for name, module in model.named_modules() if hasattr(module, "channel_attention"))


def evaluate(model, card: dict, images: np.ndarray, dtype: torch.dtype, layer: str) -> tuple[np.ndarray, np.ndarray]:
    """P(tumour) ``(N,)`` float32 and ``layer``'s alpha_s ``(N, X, Y)`` (the mean over orientations) in ``dtype``."""
    split = ArraySplit(images, np.zeros(len(images), dtype=np.int64))
    normalise = Normaliser.for_card(card, torch.device("cpu"))
    tumour, maps = [], []
    with torch.inference_mode():
        for start in range(0, len(images), BATCH_SIZE):
            batch, _ = split.get_batch(np.arange(start, min(start + BATCH_SIZE, len(images))))
            logits, trace = model.trace(normalise(batch).to(dtype), record=(layer,))
            tumour.append(torch.softmax(logits.float(), dim=1)[:, 1].numpy())
            spatial = trace.attention[layer].spatial.float()
            maps.append(spatial.reshape(len(batch), -1, *spatial.shape[-2:]).mean(dim=1).numpy())
    return np.concatenate(tumour), np.concatenate(maps)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of two maps over their pixels (ties ranked by position: the maps are continuous)."""
    ranks = [np.argsort(np.argsort(m.ravel(), kind="stable"), kind="stable") for m in (a, b)]
    return float(np.corrcoef(*ranks)[0, 1])


def slide_tumour_cells(model, card: dict, slide_path: Path, checkpoint: Path, dtype: torch.dtype) -> np.ndarray:
    """``(rows, cols)`` bool: the slide's evaluated cells with P(tumour) >= 0.5 (what its regions are made of)."""
    with tempfile.TemporaryDirectory() as store:
        plan = plan_slide(slide_path, checkpoint, Path(store))
    tumour = np.zeros((plan.grid.cells.rows, plan.grid.cells.cols), dtype=bool)
    with moved_slide(open_slide(slide_path), 0) as slide:
        for ci, cj in plan.chunks:
            result = evaluate_chunk(model, card, slide, plan.grid, ci, cj, dtype=dtype)
            i0, i1, j0, j1 = plan.grid.cell_block(ci, cj)
            tumour[i0:i1, j0:j1] = result.evaluated & (np.nan_to_num(result.probabilities[..., 1]) >= 0.5)
    return tumour


def verdict(ok: bool) -> str:
    return "PASS" if ok else "NOT MET"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=CHECKPOINT)
    parser.add_argument("--limit", type=int, default=0, help="the first N test patches only (0: all 1,944)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--slide", type=Path, default=SLIDE, help="the slide whose tumour regions are compared")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, card = load_checkpoint(args.checkpoint)
    chosen = choose_precision("bfloat16", model)
    test = load_dataset(card["training"]["config"]["dataset"], REPO / card["training"]["config"]["data_dir"]).test
    images, labels = test.images, test.labels
    if args.limit:
        images, labels = images[:args.limit], labels[:args.limit]
    layer = first_attentive_layer(model)
    print(cpu_line())
    print(f"torch {torch.__version__}, {args.threads} thread(s); {args.checkpoint.name}; {len(images)} test patches;"
          f" {chosen.reason}")
    seconds = {}
    results = {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        started = time.perf_counter()
        results[name] = evaluate(model, card, images, dtype, layer)
        seconds[name] = time.perf_counter() - started
    (p32, maps32), (p16, maps16) = results["float32"], results["bfloat16"]
    dp = np.abs(p16.astype(np.float64) - p32)
    auc32, auc16 = roc_auc(p32, labels), roc_auc(p16, labels)
    rho = np.array([spearman(a, b) for a, b in zip(maps32, maps16, strict=True)])
    print(f"patches: float32 {seconds['float32']:.1f} s, bfloat16 {seconds['bfloat16']:.1f} s "
          f"({seconds['float32'] / seconds['bfloat16']:.2f}x, batches of {BATCH_SIZE})\n")
    print("| measure | float32 | bfloat16 | difference | goal | |\n|---|---|---|---|---|---|")
    print(f"| AUC | {auc32:.5f} | {auc16:.5f} | {auc16 - auc32:+.5f} | within {GOALS['auc']} | "
          f"{verdict(abs(auc16 - auc32) <= GOALS['auc'])} |")
    worst = float(dp.max())
    print(f"| max abs dP(tumour) | | | {worst:.5f} | <= {GOALS['max_dp']} | {verdict(worst <= GOALS['max_dp'])} |")
    p99 = float(np.percentile(dp, 99))
    print(f"| 99th percentile abs dP | | | {p99:.5f} | <= {GOALS['p99_dp']} | {verdict(p99 <= GOALS['p99_dp'])} |")
    print(f"| mean abs dP | | | {dp.mean():.6f} | | |")
    flips = int(np.sum((p16 >= 0.5) != (p32 >= 0.5)))
    print(f"| calls at 0.5 that flip | | | {flips} of {len(dp)} | | |")
    print(f"| {layer} alpha_s Spearman per patch: median (5th pct, min) | | | {np.median(rho):.5f} "
          f"({np.percentile(rho, 5):.5f}, {rho.min():.5f}) | median >= {GOALS['spearman']} | "
          f"{verdict(np.median(rho) >= GOALS['spearman'])} |")
    if args.slide.is_file():
        started = time.perf_counter()
        cells32 = slide_tumour_cells(model, card, args.slide, args.checkpoint, torch.float32)
        middle = time.perf_counter()
        cells16 = slide_tumour_cells(model, card, args.slide, args.checkpoint, torch.bfloat16)
        ended = time.perf_counter()
        union = int((cells32 | cells16).sum())
        iou = (cells32 & cells16).sum() / union if union else 1.0
        print(f"| {args.slide.name}: tumour cells (P >= 0.5), IoU | {int(cells32.sum())} cells, {middle - started:.1f}"
              f" s | {int(cells16.sum())} cells, {ended - middle:.1f} s | IoU {iou:.4f} | >= {GOALS['iou']} | "
              f"{verdict(iou >= GOALS['iou'])} |")
    else:
        print(f"\n{args.slide} not found: the slide's regions were not compared")


if __name__ == "__main__":
    main()
