"""Region mode on CPU: seconds and peak memory of a whole H&E region, "tiles" against "crops", and how far apart.

The region is real H&E: the 12 PCam patches of the gallery (``app/gallery/pcam_*``, 96 x 96 each) laid
out in a fixed-seed random order, each turned by a random element of p4m (so that repeats are not identical),
into a grid large enough for ``--side`` x ``--side`` pixels (default 2048), cropped to it. Its scale is
nominally ``--mpp`` 1 um/px; the patches are really at PCam's 0.972 um/px, a 3 % difference that does not
matter for timing. Almost all of it is tissue, so nearly every cell is evaluated (the paler patches leave a few
cells under the tissue threshold; the table says how many): close to the worst case for a region of that size.

:func:`app.cells.evaluation.evaluate_region` runs it with both methods, for two networks:

* the shipped attentive model (``--checkpoint``, by default ``fa_p4m_densenet``): ``"tiles"`` (the trunk once
  over tiles of ``--tile-cells`` cells) is not the model's own function there, since alpha_F's attention pools
  over a whole tile; ``"crops"`` (every cell's 96 x 96 context alone) is. The agreement columns say by how much
  the tumour probabilities differ over the evaluated cells: max and median |p_tiles - p_crops|, the share of
  cells differing by more than 0.05 and 0.1, and the share whose most probable class is the same.
* the same p4m DenseNet without attention, the shipped ``p4m_densenet_pcam``:
  there tiles and crops are one function, and max |dp| shows round-off only. Where that checkpoint is missing
  an UNTRAINED ``p4m_densenet`` stands in (random weights, seeded, with its BatchNorm statistics taken from 32
  contexts of the region so that its probabilities are not all 0 or 1), for speed and agreement only.

Each model and method runs in its own fresh process (this file with a hidden ``--worker`` flag), so that its
peak memory is its own: the process's peak RSS (``getrusage``) and its RSS just after loading the model and
building the region ("base"), their difference being what the evaluation needs. The workers keep freed memory
for reuse as the app does (:mod:`models.cpu.allocator`). Before the timed call each runs one untimed evaluation of a
160 x 160 corner (first-call allocations, lazy imports). Seconds are the wall time of the timed
``evaluate_region`` call; ms per cell divides it by the cells evaluated. The goal of region mode is a 2048 x
2048 region in at most 30 s on a 2-core CPU; rows of that size say PASS or FAIL.

Measure on an idle machine (see :mod:`benchmarks.app_latency` on busy ones). The full run takes 4 to 5 minutes
on 2 cores, most of it the two "crops" runs.

Run from the repository root::

    python -m benchmarks.region                                  # 2048 x 2048, 2 threads
    python -m benchmarks.region --side 512 --threads 1           # a quick run
    python -m benchmarks.region --json out/region.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import models  # noqa: E402
from app.analysis.frames import InputFrame  # noqa: E402
from app.analysis.images import read_image  # noqa: E402
from app.analysis.transforms import apply_element  # noqa: E402
from app.cells.evaluation import RegionError, evaluate_region  # noqa: E402
from app.cells.mosaic import MOSAIC_PATCHES, pcam_test_mosaic, score_cells  # noqa: E402
from app.gallery import list_gallery  # noqa: E402
from benchmarks.train_step import describe_failure, max_rss_mib  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
GALLERY = REPO / "app" / "gallery"
DEFAULT_CHECKPOINT = REPO / "checkpoints" / "fa_p4m_densenet_pcam.safetensors"
PLAIN_CHECKPOINT = REPO / "checkpoints" / "p4m_densenet_pcam.safetensors"
UNTRAINED_ARCH = "p4m_densenet"
WHICH = ("checkpoint", "plain")  # the two networks, in the table's order
METHODS = ("tiles", "crops")
REGION_SEED = 0
MODEL_SEED = 0
CALIBRATION_CONTEXTS = 32
WARMUP_SIDE = 160
PATCH = 96
GOAL_SIDE = 2048
GOAL_SECONDS = 30.0
THRESHOLDS = (0.05, 0.1)


def gallery_patches() -> list[np.ndarray]:
    """The gallery's PCam patches, ``(3, 96, 96)`` float32 in [0, 1], sorted by file name."""
    paths = sorted((item.path for item in list_gallery(GALLERY, kind="he")), key=lambda path: path.name)
    if not paths:
        raise FileNotFoundError(f"no PCam patches in {GALLERY / 'gallery.json'}")
    return [read_image(path.read_bytes()) for path in paths]


def build_region(side: int, seed: int = REGION_SEED) -> np.ndarray:
    """``(3, side, side)`` float32: gallery patches in a seeded random order, each moved by a random p4m element.

    The order is a sequence of random permutations of the patches, so that each appears about equally often.
    """
    patches = gallery_patches()
    per_row = math.ceil(side / PATCH)
    count = per_row * per_row
    rng = np.random.default_rng(seed)
    order = np.concatenate([rng.permutation(len(patches)) for _ in range(math.ceil(count / len(patches)))])[:count]
    elements = rng.integers(0, 8, count)
    region = np.empty((3, per_row * PATCH, per_row * PATCH), dtype=np.float32)
    for k, (index, g) in enumerate(zip(order, elements, strict=True)):
        i, j = divmod(k, per_row)
        region[:, i * PATCH:(i + 1) * PATCH, j * PATCH:(j + 1) * PATCH] = apply_element(patches[index], int(g))
    return np.ascontiguousarray(region[:, :side, :side])


def calibrate_batchnorm(model: nn.Module, card: dict, region: np.ndarray, contexts: int = CALIBRATION_CONTEXTS,
                        seed: int = MODEL_SEED) -> nn.Module:
    """Set every BatchNorm's running statistics from ``contexts`` random 96 x 96 contexts of the region.

    A freshly built network's statistics (mean 0, variance 1) let its activations grow layer after layer, and
    its probabilities come out as exactly 0 or 1, where no difference between two methods could show. The
    contexts go through two at a time, the statistics averaged over the passes, so that the calibration's
    memory stays below the evaluation's (the peak RSS is a high-water mark).
    """
    rng = np.random.default_rng(seed)
    size = int(card["input"]["size"])
    rows, cols = region.shape[1:]
    tops, lefts = rng.integers(0, rows - size + 1, contexts), rng.integers(0, cols - size + 1, contexts)
    batch = np.stack([region[:, top:top + size, left:left + size] for top, left in zip(tops, lefts, strict=True)])
    x = InputFrame.from_card(card, model.group).to_network(torch.from_numpy(batch))
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.reset_running_stats()
            module.momentum = None  # a cumulative average over the passes
    model.train()
    with torch.no_grad():
        for part in x.split(2):
            model(part)
    return model.eval()


def load_network(which: str, checkpoint: str | Path, region: np.ndarray,
                 plain: str | Path | None = PLAIN_CHECKPOINT) -> tuple[models.Network, dict, str]:
    """``(model in eval mode, card, label)`` for ``"checkpoint"`` or ``"plain"`` (the network without attention).

    Without a ``plain`` checkpoint, an untrained p4m DenseNet takes the checkpoint's card with its ``arch``
    changed: the input convention, dataset (hence scale) and class names are what region mode reads from it.
    """
    if which not in WHICH:
        raise ValueError(f"which must be one of {WHICH}, got {which!r}")
    if which == "plain" and plain is not None and Path(plain).is_file():
        model, card = models.load_checkpoint(plain)
        return model.eval(), card, f"{Path(plain).stem} (no attention)"
    model, card = models.load_checkpoint(checkpoint)
    if which == "checkpoint":
        return model.eval(), card, Path(checkpoint).stem
    torch.manual_seed(MODEL_SEED)
    untrained = models.build_model(UNTRAINED_ARCH)
    card = {**card, "arch": UNTRAINED_ARCH}
    return calibrate_batchnorm(untrained, card, region), card, f"{UNTRAINED_ARCH} (untrained)"


def measure(which: str, method: str, checkpoint: str | Path, side: int, mpp: float,
            tile_cells: int) -> tuple[dict, np.ndarray]:
    """One region through one network with one method, in this process.

    Returns the numbers and the ``(rows, cols, classes)`` probabilities (NaN where not evaluated).
    """
    region = build_region(side)
    model, card, label = load_network(which, checkpoint, region)
    base = max_rss_mib()
    warmup = region[:, :min(side, WARMUP_SIDE), :min(side, WARMUP_SIDE)]
    try:
        evaluate_region(model, card, warmup, mpp, method=method, tile_cells=tile_cells)
    except RegionError:  # a corner without tissue: nothing to warm up with there
        pass
    start = time.perf_counter()
    result = evaluate_region(model, card, region, mpp, method=method, tile_cells=tile_cells)
    seconds = time.perf_counter() - start
    peak = max_rss_mib()
    evaluated = int(result.evaluated.sum())
    record = {
        "which": which, "label": label, "arch": card["arch"], "method": method, "side": side, "mpp": mpp,
        "tile_cells": tile_cells if method == "tiles" else None, "threads": torch.get_num_threads(),
        "model_mpp": result.model_microns_per_pixel, "scaled_shape": list(result.image.shape[1:]),
        "grid": [result.grid.rows, result.grid.cols], "cells": result.grid.rows * result.grid.cols,
        "evaluated": evaluated, "tissue_mean": float(result.tissue.mean()),
        "seconds": seconds, "seconds_reported": result.seconds,
        "ms_per_cell": 1000 * seconds / evaluated if evaluated else math.nan,
        "rss_base_mib": base, "rss_peak_mib": peak, "rss_increment_mib": peak - base,
    }
    return record, result.probabilities


def agreement(tiles: np.ndarray, crops: np.ndarray) -> dict:
    """Tiles against crops over the cells both evaluated: the last class's probability and the argmax."""
    both = np.isfinite(tiles[..., -1]) & np.isfinite(crops[..., -1])
    same_cells = bool(np.array_equal(np.isfinite(tiles[..., -1]), np.isfinite(crops[..., -1])))
    if not both.any():
        return {"cells": 0, "same_cells": same_cells}
    dp = np.abs(tiles[..., -1] - crops[..., -1])[both]
    same_class = (tiles.argmax(axis=-1) == crops.argmax(axis=-1))[both]
    return {
        "cells": int(both.sum()), "same_cells": same_cells,
        "max_abs_dp": float(dp.max()), "median_abs_dp": float(np.median(dp)),
        **{f"share_over_{t}": float((dp > t).mean()) for t in THRESHOLDS},
        "same_class": float(same_class.mean()),
    }


def run_worker(which: str, method: str, args: argparse.Namespace, folder: Path) -> tuple[dict, np.ndarray | None]:
    """:func:`measure` in a fresh process; a failure becomes an ``error`` entry, not an exception."""
    array = folder / f"{which}_{method}.npy"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", which, method, "--folder", str(folder),
           "--checkpoint", str(Path(args.checkpoint).resolve()), "--side", str(args.side), "--mpp", str(args.mpp),
           "--threads", str(args.threads), "--tile-cells", str(args.tile_cells)]
    failed = {"which": which, "method": method}
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return failed | {"error": f"timed out after {args.timeout} s"}, None
    if proc.returncode != 0:
        return failed | {"error": describe_failure(proc)}, None
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1]), np.load(array)
    except (IndexError, json.JSONDecodeError, OSError, ValueError):
        return failed | {"error": f"unreadable worker output: {proc.stdout[-200:]!r}"}, None


def worker_main(args: argparse.Namespace) -> int:
    """The worker: as the app runs (freed memory retained), one measurement; JSON on the last line of stdout."""
    from models.cpu.allocator import retain_freed_memory

    retained = retain_freed_memory()
    torch.set_num_threads(args.threads)
    which, method = args.worker
    record, probabilities = measure(which, method, args.checkpoint, args.side, args.mpp, args.tile_cells)
    np.save(Path(args.folder) / f"{which}_{method}.npy", probabilities)
    print(json.dumps(record | {"freed_memory_retained": retained}))
    return 0


def goal_verdict(record: dict) -> str:
    if "error" in record:
        return "-"
    if record["side"] != GOAL_SIDE:
        return f"n/a ({GOAL_SIDE} px only)"
    return "PASS" if record["seconds"] <= GOAL_SECONDS else "FAIL"


def compare(runs: dict[tuple[str, str], dict], arrays: dict[tuple[str, str], np.ndarray | None]) -> list[dict]:
    """Per network: crops / tiles in time and memory, and the agreement of their probabilities."""
    rows = []
    for which in WHICH:
        tiles, crops = runs.get((which, "tiles")), runs.get((which, "crops"))
        if not tiles or not crops:
            continue
        row = {"which": which, "label": tiles.get("label") or crops.get("label") or which}
        if "error" in tiles or "error" in crops:
            rows.append(row | {"error": tiles.get("error") or crops.get("error")})
            continue
        row["time_ratio"] = crops["seconds"] / tiles["seconds"]
        row["increment_ratio"] = crops["rss_increment_mib"] / max(tiles["rss_increment_mib"], 1e-9)
        row["agreement"] = agreement(arrays[(which, "tiles")], arrays[(which, "crops")])
        rows.append(row)
    return rows


def print_tables(runs: dict[tuple[str, str], dict], comparisons: list[dict]) -> None:
    print("| model | method | cells evaluated / grid | seconds | ms per cell | RSS base (MiB) | peak RSS (MiB) "
          f"| increment (MiB) | goal <= {GOAL_SECONDS:.0f} s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (which, method), r in runs.items():
        label = r.get("label", which)
        name = f"{method} ({r['tile_cells']} cells)" if method == "tiles" and "error" not in r else method
        if "error" in r:
            print(f"| {label} | {name} | error: {r['error']} | | | | | | - |")
            continue
        rows, cols = r["grid"]
        print(f"| {label} | {name} | {r['evaluated']} / {r['cells']} ({rows} x {cols}) | {r['seconds']:.1f} "
              f"| {r['ms_per_cell']:.1f} | {r['rss_base_mib']:.0f} | {r['rss_peak_mib']:.0f} "
              f"| {r['rss_increment_mib']:.0f} | {goal_verdict(r)} |")
    print()
    print("| model | crops / tiles time | crops / tiles increment | max abs dp | median abs dp "
          + " ".join(f"| abs dp > {t}" for t in THRESHOLDS) + " | same class | cells compared |")
    print("|---|---|---|---|---|" + "---|" * len(THRESHOLDS) + "---|---|")
    for c in comparisons:
        if "error" in c:
            print(f"| {c['label']} | error: {c['error']} |")
            continue
        a = c["agreement"]
        if not a["cells"]:
            print(f"| {c['label']} | {c['time_ratio']:.2f} | {c['increment_ratio']:.2f} | no cell in common |")
            continue
        shares = " ".join(f"| {100 * a[f'share_over_{t}']:.1f} %" for t in THRESHOLDS)
        print(f"| {c['label']} | {c['time_ratio']:.2f} | {c['increment_ratio']:.2f} | {a['max_abs_dp']:.3g} "
              f"| {a['median_abs_dp']:.3g} {shares} | {100 * a['same_class']:.1f} % "
              f"| {a['cells']}{'' if a['same_cells'] else ' (evaluated cells differ)'} |")


def mosaic_scores(checkpoint: str | Path, threads: int, tile_cells: int, patches: int = MOSAIC_PATCHES) -> dict:
    """The attentive model on the PCam test mosaic of ``patches`` patches (:mod:`app.cells.mosaic`), both methods,
    scored against the truth.

    Crops evaluate each patch's centre cell in exactly that patch, so their AUC is the card's test AUC; tiles show
    what the shared trunk's different function does to the score.
    """
    torch.set_num_threads(threads)
    model, card = models.load_checkpoint(checkpoint)
    mosaic = pcam_test_mosaic(card, count=patches)
    scores = {}
    for method in METHODS:
        result = evaluate_region(model.eval(), card, mosaic.image, mosaic.microns_per_pixel, method=method,
                                 tile_cells=tile_cells, cells=mosaic.labelled)
        score = score_cells(result.positive, mosaic.labels)
        scores[method] = dict(auc=score.auc, accuracy=score.accuracy, cells=score.scored, seconds=result.seconds)
        print(f"PCam test mosaic, {method}: {score.summary()} ({result.seconds:.1f} s)")
    print(f"  mosaic: {mosaic.source.split('. ')[0]}; the card's test AUC: {card['metrics'].get('test_auc')}")
    return scores | {"source": mosaic.source, "card_test_auc": card["metrics"].get("test_auc")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default=str(DEFAULT_CHECKPOINT), help="the attentive H&E model")
    parser.add_argument("--side", type=int, default=GOAL_SIDE, help="region side in pixels (default 2048)")
    parser.add_argument("--mpp", type=float, default=1.0, help="the region's nominal micrometres per pixel")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tile-cells", type=int, default=15, help="longest tile side in cells (method tiles)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed to each worker")
    parser.add_argument("--mosaic-patches", type=int, default=MOSAIC_PATCHES,
                        help=f"patches of the scored PCam test mosaic (default {MOSAIC_PATCHES})")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--worker", nargs=2, metavar=("WHICH", "METHOD"), help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args)

    print(f"torch {torch.__version__}, {args.threads} threads, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs; region {args.side} x {args.side} px at nominally {args.mpp} um/px from the "
          f"{len(gallery_patches())} PCam gallery patches (seed {REGION_SEED}); each model and method in its "
          "own process", flush=True)
    runs: dict[tuple[str, str], dict] = {}
    arrays: dict[tuple[str, str], np.ndarray | None] = {}
    with tempfile.TemporaryDirectory(prefix="region_bench_") as folder:
        for which in WHICH:
            for method in METHODS:
                record, probabilities = run_worker(which, method, args, Path(folder))
                runs[(which, method)], arrays[(which, method)] = record, probabilities
                done = record.get("error") or f"{record['seconds']:.1f} s"
                print(f"  {record.get('label', which)}, {method}: {done}", file=sys.stderr, flush=True)
    comparisons = compare(runs, arrays)
    some = next((r for r in runs.values() if "error" not in r), None)
    if some:
        print(f"at the model's {some['model_mpp']} um/px the region is {some['scaled_shape'][0]} x "
              f"{some['scaled_shape'][1]} px, {some['grid'][0]} x {some['grid'][1]} cells of 32 x 32 px; "
              f"mean tissue share per cell {some['tissue_mean']:.2f}")
    print_tables(runs, comparisons)
    print("dp: tumour probability, tiles minus crops, over the cells both evaluated. An untrained network (where "
          "named so) has random weights, BatchNorm statistics from the region; it is there for speed and agreement.")
    mosaic = mosaic_scores(args.checkpoint, args.threads, args.tile_cells, args.mosaic_patches)
    if args.json:
        out = {"torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
               "cpus": os.cpu_count(), "threads": args.threads, "side": args.side, "mpp": args.mpp,
               "tile_cells": args.tile_cells, "checkpoint": args.checkpoint, "region_seed": REGION_SEED,
               "goal_seconds": GOAL_SECONDS, "goal_side": GOAL_SIDE,
               "runs": [r | {"goal": goal_verdict(r)} for r in runs.values()], "comparisons": comparisons,
               "mosaic": mosaic}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0 if all("error" not in r for r in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
