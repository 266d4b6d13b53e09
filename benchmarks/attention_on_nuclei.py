"""The paper's Fig. 5 claim over a test set: the first attention layer against nuclei and background.

    python -m benchmarks.attention_on_nuclei checkpoints/fa_p4m_densenet_pcam.safetensors \
        [--data-dir ../shared/data/pcam_public] [--figure docs/attention_on_nuclei.png] [--per-patch rows.csv] \
        [--count 400 [--seed 0]] [--write-card]

For every test patch of the card's dataset (its ``test`` split, as its reader gives it), the app's own
maps and measure (:func:`app.analysis.nuclei.nuclei_statistics`, see :func:`measure`) give the rank
correlation of the first attentive layer's effective map with haematoxylin, and its mean on tissue and on
background. Prints mean, standard deviation and quartiles over the patches, and a line per attentive layer;
``--figure`` draws the distribution and six patches (image, haematoxylin, attention); ``--per-patch`` writes one
CSV row per patch; ``--write-card`` stores the summary in the checkpoint's card (``attention_on_nuclei``), weights
unchanged. The card keeps no per-patch rows: 1,944 of them would double a PCam card's size. All 1,944 take
about a minute on two idle cores (7 minutes when every patch went through all eight transforms); beside a
two-thread training run the threads oversubscribe the cores, so pause training (or use ``--count``, a seeded
random sample).
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import sys
from pathlib import Path

import numpy as np
import torch

from app.analysis.frames import InputFrame
from app.analysis.nuclei import nuclei_statistics
from app.analysis.reductions import reduce_attention, upsample
from models import load_checkpoint, save_checkpoint
from models.cpu.allocator import retain_freed_memory
from training.data import load_dataset


def measure(model, card: dict, images: np.ndarray, batch: int = 16) -> dict[str, list]:
    """Every attentive layer's :class:`~app.analysis.nuclei.NucleiAttention` per ``(3, S, S)`` image in [0, 1], by layer
    name in forward order (the first is the one the card reports).

    The app's maps of the image as given (its identity transform: :func:`app.analysis.compute.analyse` runs all
    eight, which the claim does not need), ``batch`` images per forward pass: the same reductions as the app's
    (:func:`app.analysis.reductions.reduce_attention`, then :func:`~app.analysis.reductions.upsample`), equal to
    :func:`app.analysis.nuclei.attention_on_nuclei` on the app's analysis to round-off (tested).
    """
    frame = InputFrame.from_card(card, model.group)
    dtype = next(model.parameters()).dtype
    size = images.shape[-1]
    by_layer: dict[str, list] = {}
    for first in range(0, len(images), batch):
        chunk = images[first:first + batch]  # (B, 3, S, S)
        with torch.inference_mode():
            _, trace = model.trace(frame.to_network(torch.from_numpy(np.ascontiguousarray(chunk)).to(dtype)))
            for name, parts in trace.attention.items():
                maps = reduce_attention(frame.attention_to_user(parts)).float()  # (B, H, X, Y)
                upsampled = upsample(maps, size).mean(dim=1).numpy()  # (B, S, S): mean over orientations
                by_layer.setdefault(name, []).extend(nuclei_statistics(image, attention, name)
                                                     for image, attention in zip(chunk, upsampled, strict=True))
    return by_layer


def with_tissue_and_background(results: list) -> list:
    """The patches that have both (a near-uniform patch of glass has background and no tissue)."""
    return [r for r in results if r.background_mean is not None and r.tissue_mean is not None]


def layer_table(by_layer: dict[str, list]) -> dict:
    """Mean and sd over patches of each layer's rank correlation, and of tissue minus background where defined."""
    table = {}
    for name, results in by_layer.items():
        rho = np.array([r.spearman for r in results])
        gap = np.array([r.tissue_mean - r.background_mean for r in with_tissue_and_background(results)])
        table[name] = {"spearman_mean": float(np.nanmean(rho)), "spearman_std": float(np.nanstd(rho, ddof=1)),
                       "tissue_minus_background_mean": float(gap.mean()) if len(gap) else None}
    return table


def summarise(results: list, names: list[str]) -> dict:
    rho = np.array([r.spearman for r in results])
    both = with_tissue_and_background(results)
    gap = np.array([r.tissue_mean - r.background_mean for r in both])

    def spread(values: np.ndarray) -> dict:
        q1, median, q3 = np.percentile(values, [25, 50, 75]) if len(values) else (np.nan,) * 3
        return {"mean": float(np.mean(values)) if len(values) else None,
                "std": float(np.std(values, ddof=1)) if len(values) > 1 else None,
                "median": float(median), "q1": float(q1), "q3": float(q3), "count": len(values)}

    return {
        "layer": results[0].layer,
        "spearman_with_haematoxylin": spread(rho),
        "share_positive": float(np.mean(rho > 0)),
        "tissue_minus_background": spread(gap),
        "tissue_mean": spread(np.array([r.tissue_mean for r in both])),
        "background_mean": spread(np.array([r.background_mean for r in both])),
        "patches": len(results),
        "per_patch": [{"file": n, "spearman": round(r.spearman, 4), "tissue_mean": r.tissue_mean,
                       "background_mean": r.background_mean, "tissue_fraction": round(r.tissue_fraction, 4)}
                      for n, r in zip(names, results, strict=True)],
    }


def draw(results: list, names: list[str], labels: np.ndarray, images: np.ndarray, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rho = np.array([r.spearman for r in results])
    # Six patches spread over the distribution: the 10th to 90th percentiles of rho.
    order = np.argsort(rho)
    picks = order[np.round(np.linspace(0.1, 0.9, 6) * (len(order) - 1)).astype(int)]
    fig = plt.figure(figsize=(12, 8.6), dpi=90)
    grid = fig.add_gridspec(4, 6, height_ratios=[1, 1, 1, 1.1], hspace=0.35, wspace=0.08)
    for col, i in enumerate(picks):
        r = results[i]
        short = Path(names[i]).stem[:12]  # PCam file names are 40-digit hashes: their start tells them apart
        rows = [(images[i].transpose(1, 2, 0), None, f"{short}\n{'tumour' if labels[i] else 'normal'}"),
                (r.haematoxylin, "Blues", "haematoxylin"),
                (r.attention, "viridis", f"attention, ρ = {r.spearman:+.2f}")]
        for row, (values, cmap, title) in enumerate(rows):
            ax = fig.add_subplot(grid[row, col])
            ax.imshow(values, cmap=cmap)
            ax.set_title(title, fontsize=8)
            ax.axis("off")
    ax = fig.add_subplot(grid[3, :3])
    ax.hist(rho, bins=20, color="#4c72b0")
    ax.axvline(0, color="grey", lw=1)
    ax.set_xlabel(f"rank correlation of {results[0].layer} attention with haematoxylin, per test patch")
    ax.set_ylabel("patches")
    both = [(r.tissue_mean, r.background_mean) for r in with_tissue_and_background(results)]
    ax = fig.add_subplot(grid[3, 4:])
    if both:
        tissue, background = np.array(both).T
        ax.scatter(background, tissue, s=12)
        low, high = min(tissue.min(), background.min()), max(tissue.max(), background.max())
        ax.plot([low, high], [low, high], color="grey", lw=1)
    ax.set_xlabel("mean attention on background")
    ax.set_ylabel("on tissue")
    fig.savefig(out, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--data-dir", type=Path, default=None, help="default: the card's training data_dir")
    parser.add_argument("--figure", type=Path)
    parser.add_argument("--per-patch", type=Path, help="CSV of every patch's rho, tissue and background means")
    parser.add_argument("--count", type=int, default=0,
                        help="a seeded random sample of this many test patches (default: all; 0.2 s each, 2 cores)")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed")
    parser.add_argument("--write-card", action="store_true")
    args = parser.parse_args(argv)
    retain_freed_memory()  # as the app: every batch reuses the last one's pages
    model, card = load_checkpoint(args.checkpoint)
    model.eval()
    data_dir = args.data_dir or Path(card["training"]["config"]["data_dir"])
    splits = load_dataset(card["dataset"]["name"], data_dir)
    chosen = np.arange(len(splits.test))
    if 0 < args.count < len(chosen):
        chosen = np.sort(np.random.default_rng(args.seed).choice(chosen, args.count, replace=False))
    images, labels = splits.test.get_batch(chosen)
    names = [splits.spec.test_files[i] if splits.spec.test_files else str(i) for i in chosen]
    by_layer = measure(model, card, images)
    results = next(iter(by_layer.values()), [None])
    if any(r is None for r in results):
        print(f"error: {args.checkpoint} has no attentive layer: nothing to compare with nuclei", file=sys.stderr)
        return 1
    summary = summarise(results, names)
    summary["by_layer"] = layer_table(by_layer)
    print(json.dumps({k: v for k, v in summary.items() if k not in ("per_patch", "by_layer")}, indent=1))
    print("every attentive layer: mean +- sd of rho over patches; mean of tissue minus background")
    for name, row in summary["by_layer"].items():
        gap = row["tissue_minus_background_mean"]
        print(f"  {name:28s} {row['spearman_mean']:+.3f} +- {row['spearman_std']:.3f}   "
              f"{'-' if gap is None else f'{gap:+.4f}'}")
    if args.figure:
        args.figure.parent.mkdir(parents=True, exist_ok=True)
        draw(results, names, labels, images, args.figure)
    if args.per_patch:
        args.per_patch.parent.mkdir(parents=True, exist_ok=True)
        with args.per_patch.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(summary["per_patch"][0]))
            writer.writeheader()
            writer.writerows(summary["per_patch"])
    if args.write_card:
        summary = {key: value for key, value in summary.items() if key != "per_patch"}
        sample = f" (a random sample, seed {args.seed})" if len(results) < len(splits.test) else ""
        summary["measured_on"] = (f"{len(results)} of the {len(splits.test)} test patches of {card['dataset']['name']}"
                                  f"{sample}, identity transform")
        summary["command"] = "python -m benchmarks.attention_on_nuclei " + shlex.join(sys.argv[1:] if argv is None
                                                                                         else argv)
        save_checkpoint(model, args.checkpoint, {**card, "attention_on_nuclei": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
