"""The paper's Fig. 5 claim over a test set, in every reading of attention and for the paper's composite picture.

    python -m benchmarks.attention_on_nuclei checkpoints/fa_p4m_densenet_pcam.safetensors \
        [--data-dir ../shared/data/pcam_public] [--per-patch rows.csv] [--count 200 [--seed 0]] [--write-card]
    python -m benchmarks.attention_on_nuclei ../runs/pcam_table3-fa_p4_densenet-seed1/best.safetensors \
        --results-card results/pcam_table3_seeds/fa_p4_densenet-seed1.json
    python -m benchmarks.attention_on_nuclei checkpoints/fa_p4m_densenet_pcam.safetensors --table

For every test patch of the card's dataset (its ``test`` split, as its reader gives it), one forward pass gives
every attentive layer's maps in three readings (:data:`models.attention.parts.READINGS`): ``kept`` (alpha+ =
1 - alpha_c alpha_s, what the layer multiplies its input by), ``removed`` (alpha- = alpha_c alpha_s) and
``spatial`` (alpha_s alone), each the mean over channels and orientations stretched over the patch by the app's
:func:`~app.analysis.reductions.upsample`; and the paper's ``composite`` (the product of every layer's alpha_s,
:func:`app.analysis.composite.paper_composite`, summed over orientations as the paper plots it). Readings are
float64 and kept is computed as 1 - removed, so their rank correlations are exact negatives patch by patch.
:func:`app.analysis.nuclei.map_numbers` measures each map against the patch's haematoxylin, glass and nuclei.

Over the patches, every number gets its mean with a 95 % interval (percentile bootstrap over patches, 2,000
resamples, seeded), sd, median, share positive and count (patches where it is defined). Prints the first
layer and the composite per reading; ``--per-patch`` writes one CSV row per patch (first layer and composite);
``--write-card`` stores every layer's table in the checkpoint's card (``attention_on_nuclei``), weights
unchanged; ``--results-card CARD`` in a sweep's results card instead (a run measured from its run folder). Either
way the card's test record stays bound to it (``experiments.card_records.edit_card``). All 1,944 patches take about 8
minutes on one thread beside a two-thread training run; ``--count`` measures a seeded random sample. ``--table``
prints the markdown tables of docs/pathology.md from the card.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shlex
import sys
from pathlib import Path

import numpy as np
import torch

from app.analysis.composite import COMPOSITE_DESCRIPTION, paper_composite
from app.analysis.frames import InputFrame
from app.analysis.nuclei import MIN_BACKGROUND, MIN_NUCLEI, NUMBERS, PatchStains, map_numbers
from app.analysis.readings import COMPOSITE
from app.analysis.reductions import READING_FORMULAS, reduce_readings, upsample
from experiments.card_records import edit_card
from models import load_checkpoint
from models.checkpoint import card_path
from models.cpu.allocator import retain_freed_memory
from models.stain import NUCLEI_HAEMATOXYLIN, TISSUE_OD
from training.data import load_dataset

PROGRESS_EVERY = 128  # patches between progress lines
RESAMPLES, BOOTSTRAP_SEED = 2000, 0
INTERVAL = (f"95 % percentile bootstrap over patches ({RESAMPLES} resamples, seed {BOOTSTRAP_SEED}); "
            "sd with ddof 1; n = patches where the number is defined")
NUMBER_TEXT = {
    "spearman": "rank correlation with haematoxylin over the patch's pixels",
    "tissue_minus_background": f"mean on tissue minus on background (patches with at least {MIN_BACKGROUND:.0%} "
                               "background)",
    "tissue_minus_background_relative": "the same divided by the map's mean over the patch",
    "nuclei_minus_stroma": f"mean on nuclei minus on the rest of the tissue (patches where each covers at least "
                           f"{MIN_NUCLEI:.0%})",
    "nuclei_minus_stroma_relative": "the same divided by the map's mean over the patch",
}


def measure(model, card: dict, images: np.ndarray, batch: int = 16) -> dict[str, dict[str, np.ndarray]]:
    """Per-patch numbers of every reading and layer: ``{reading: {layer: (N, len(NUMBERS)) float64}}``.

    ``images``: ``(N, 3, S, S)`` in [0, 1]. Readings ``kept``, ``removed``, ``spatial`` (layers without spatial
    attention have none) by layer name in forward order, and ``composite`` with the one layer ``composite``
    (absent for a model without spatial attention). NaN where a number is not defined (see
    :func:`app.analysis.nuclei.map_numbers`). One forward pass per ``batch`` images.
    """
    frame = InputFrame.from_card(card, model.group)
    dtype = next(model.parameters()).dtype
    size = images.shape[-1]
    orientations = len(model.group.elements()) if model.group is not None else 1
    rows: dict[str, dict[str, list]] = {}
    for first in range(0, len(images), batch):
        chunk = images[first:first + batch]  # (B, 3, S, S)
        stains = [PatchStains.of(image) for image in chunk]
        with torch.inference_mode():
            _, trace = model.trace(frame.to_network(torch.from_numpy(np.ascontiguousarray(chunk)).to(dtype)))
            user = {name: frame.attention_to_user(parts) for name, parts in trace.attention.items()}
            maps: dict[tuple[str, str], np.ndarray] = {}
            for name, parts in user.items():
                readings = reduce_readings(parts)  # float64 (B, H, x, y) each
                removed = upsample(readings["removed"], size).mean(dim=1).numpy()  # (B, S, S)
                maps["kept", name], maps["removed", name] = 1 - removed, removed
                if "spatial" in readings:
                    maps["spatial", name] = upsample(readings["spatial"], size).mean(dim=1).numpy()
            composite = paper_composite(user, size, orientations)  # (B, G, S, S) float64
            if composite is not None:
                maps[COMPOSITE, COMPOSITE] = composite.sum(dim=1).numpy()  # as the paper plots it
        for (reading, name), values in maps.items():
            numbers = (map_numbers(s, v) for s, v in zip(stains, values, strict=True))  # once per map
            rows.setdefault(reading, {}).setdefault(name, []).extend([row[n] for n in NUMBERS] for row in numbers)
    order = ["kept", "removed", "spatial", COMPOSITE]
    return {reading: {name: np.array(values, dtype=np.float64) for name, values in rows[reading].items()}
            for reading in order if reading in rows}


def _significant(value: float) -> float:
    """Six significant digits: the composite's numbers are near 1e-4, so fixed decimals would erase them."""
    return float(f"{value:.6g}")


def summarise(values: np.ndarray) -> dict:
    """Mean, 95 % interval (:data:`INTERVAL`), sd, median, share positive and count of one number over patches.

    NaN entries (patches where the number is not defined) are left out; with none left every figure is None.
    """
    values = values[~np.isnan(values)]
    n = len(values)
    if n == 0:
        return {"mean": None, "low": None, "high": None, "sd": None, "median": None, "share_positive": None, "n": 0}
    # A fresh generator per number: each interval depends only on its own values, not on what was summarised first.
    draws = np.random.default_rng(BOOTSTRAP_SEED).integers(0, n, size=(RESAMPLES, n))
    low, high = np.percentile(values[draws].mean(axis=1), [2.5, 97.5])
    return {"mean": _significant(values.mean()), "low": _significant(low), "high": _significant(high),
            "sd": _significant(values.std(ddof=1)) if n > 1 else None, "median": _significant(np.median(values)),
            "share_positive": _significant(np.mean(values > 0)), "n": n}


def table(numbers: np.ndarray) -> dict:
    """``(N, len(NUMBERS))`` per-patch numbers -> {number: summary}."""
    return {name: summarise(numbers[:, k]) for k, name in enumerate(NUMBERS)}


def readings_summary(measured: dict[str, dict[str, np.ndarray]]) -> dict:
    """The card's ``readings``: per reading what it is, the summary of its first layer (the composite's own for
    ``composite``) and, for the layer readings, every layer's table in forward order."""
    result = {}
    for reading, by_layer in measured.items():
        tables = {name: table(numbers) for name, numbers in by_layer.items()}
        first = next(iter(tables))
        entry = {"what": COMPOSITE_DESCRIPTION if reading == COMPOSITE else READING_FORMULAS[reading],
                 "summary_of": first, "summary": tables[first]}
        if reading != COMPOSITE:
            entry["by_layer"] = tables
        result[reading] = entry
    return result


def card_entry(measured: dict[str, dict[str, np.ndarray]], measured_on: str, command: str) -> dict:
    """The checkpoint card's ``attention_on_nuclei``."""
    layers = list(measured["kept"])
    return {
        "what": "The paper's Fig. 5 claim (attention on nuclei, not on background) per reading of attention, "
                "each map the mean over channels and orientations stretched over the patch",
        "readings": readings_summary(measured),
        "numbers": NUMBER_TEXT,
        "interval": INTERVAL,
        "thresholds": {"tissue_optical_density": TISSUE_OD, "tissue_window_pixels": 11,
                       "min_background_share": MIN_BACKGROUND, "nuclei_haematoxylin": NUCLEI_HAEMATOXYLIN,
                       "nuclei_window_pixels": 3, "min_nuclei_and_stroma_share": MIN_NUCLEI},
        "layers": layers,
        "first_layer": layers[0],
        "patches": len(measured["kept"][layers[0]]),
        "measured_on": measured_on,
        "command": command,
    }


def interval_text(summary: dict, digits: int = 3) -> str:
    """``+0.123 [+0.110, +0.136] (n 1944)`` or ``-`` where nothing was defined."""
    if summary["mean"] is None:
        return "-"
    return (f"{summary['mean']:+.{digits}g} [{summary['low']:+.{digits}g}, {summary['high']:+.{digits}g}] "
            f"(sd {summary['sd'] or 0:.2g}, n {summary['n']})")


def print_summary(readings: dict) -> None:
    for reading, entry in readings.items():
        print(f"{reading} ({entry['summary_of']}):")
        for name, summary in entry["summary"].items():
            print(f"  {name:34s} {interval_text(summary)}")
    print("every layer: mean rank correlation with haematoxylin; nuclei minus stroma relative to the map's mean")
    for name in readings["kept"]["by_layer"]:
        cells = []
        for reading in ("kept", "removed", "spatial"):
            row = readings.get(reading, {}).get("by_layer", {}).get(name)
            gap = None if row is None else row["nuclei_minus_stroma_relative"]["mean"]
            cells.append("-" if row is None else f"{reading} {row['spearman']['mean']:+.3f} "
                         f"{math.nan if gap is None else gap:+.3f}")
        print(f"  {name:22s} " + "   ".join(cells))


def _cell(summary: dict, digits: int) -> str:
    if summary["mean"] is None:
        return "-"
    return f"{summary['mean']:+.{digits}f} [{summary['low']:+.{digits}f}, {summary['high']:+.{digits}f}]"


def markdown_tables(entry: dict, layers: int = 3) -> str:
    """docs/pathology.md's Fig. 5 tables from a card's ``attention_on_nuclei``: the first ``layers`` layers in
    each reading and the composite, every number; then every layer's rank correlation per reading."""
    readings, n = entry["readings"], entry["patches"]
    digits = {"spearman": 3, "tissue_minus_background": 4, "nuclei_minus_stroma": 4}
    lines = [f"| map ({n} test patches; mean [95 % interval]) | ρ with haematoxylin | share ρ > 0 | "
             "tissue - glass | relative | nuclei - stroma | relative |", "|---|---|---|---|---|---|---|"]
    maps = [(name, reading) for name in entry["layers"][:layers] for reading in ("kept", "removed", "spatial")
            if name in readings.get(reading, {}).get("by_layer", {})]
    for name, reading in [*maps, (COMPOSITE, COMPOSITE)]:
        row = readings[reading]["summary"] if reading == COMPOSITE else readings[reading]["by_layer"][name]
        scale = 2 if reading == COMPOSITE else None  # the composite is near 1e-4: absolute means in scientific form
        cells = [_cell(row["spearman"], 3), f"{100 * row['spearman']['share_positive']:.0f} %"]
        for number in ("tissue_minus_background", "nuclei_minus_stroma"):
            absolute = row[number]
            cells.append(f"{absolute['mean']:+.{scale}e}" if scale and absolute["mean"] is not None
                         else _cell(absolute, digits[number]))
            cells.append(_cell(row[f"{number}_relative"], 3))
        label = "composite (Σ orientations)" if reading == COMPOSITE else f"`{name}` {reading}"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "| layer | ρ kept (= - ρ removed) | ρ spatial | nuclei - stroma relative, kept | removed | spatial |",
              "|---|---|---|---|---|---|"]
    for name in entry["layers"]:
        rows = {r: readings[r]["by_layer"].get(name) for r in ("kept", "removed", "spatial") if r in readings}
        cells = [_cell(rows["kept"]["spearman"], 3),
                 _cell(rows["spatial"]["spearman"], 3) if rows.get("spatial") else "-"]
        cells += [_cell(rows[r]["nuclei_minus_stroma_relative"], 3) if rows.get(r) else "-"
                  for r in ("kept", "removed", "spatial")]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_rows(path: Path, names: list[str], measured: dict[str, dict[str, np.ndarray]]) -> None:
    """One CSV row per patch: the first layer's numbers in each reading, and the composite's."""
    columns, blocks = ["file"], []
    for reading, by_layer in measured.items():
        name, numbers = next(iter(by_layer.items()))
        columns += [f"{reading}:{name}:{n}" for n in NUMBERS]
        blocks.append(numbers)
    values = np.concatenate(blocks, axis=1)  # (N, readings * len(NUMBERS))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        writer.writerows([name, *(f"{v:.6g}" for v in row)] for name, row in zip(names, values, strict=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--data-dir", type=Path, default=None, help="default: the card's training data_dir")
    parser.add_argument("--per-patch", type=Path, help="CSV of every patch's numbers (first layer and composite)")
    parser.add_argument("--count", type=int, default=0, help="a seeded random sample of this many test patches "
                        "(default: all)")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: beside a training run, a second thread mostly waits)")
    parser.add_argument("--write-card", action="store_true", help="store the measurement in the checkpoint's card")
    parser.add_argument("--results-card", type=Path, help="store it in this card of a sweep's results folder instead "
                        "(a run's checkpoint measured, e.g. ../runs/NAME/best.safetensors)")
    parser.add_argument("--table", action="store_true",
                        help="print docs/pathology.md's Fig. 5 tables from the card's measurement, measure nothing")
    args = parser.parse_args(argv)
    if args.table:
        print(markdown_tables(json.loads(card_path(args.checkpoint).read_text())["attention_on_nuclei"]))
        return 0
    torch.set_num_threads(args.threads)
    retain_freed_memory()  # as the app: every batch reuses the last one's pages
    model, card = load_checkpoint(args.checkpoint)
    data_dir = args.data_dir or Path(card["training"]["config"]["data_dir"])
    splits = load_dataset(card["dataset"]["name"], data_dir)
    chosen = np.arange(len(splits.test))
    if 0 < args.count < len(chosen):
        chosen = np.sort(np.random.default_rng(args.seed).choice(chosen, args.count, replace=False))
    images, _ = splits.test.get_batch(chosen)
    names = [splits.spec.test_files[i] if splits.spec.test_files else str(i) for i in chosen]
    measured: dict[str, dict[str, np.ndarray]] = {}
    for first in range(0, len(images), PROGRESS_EVERY):
        # Pieces, so that a long run beside training says how far it got.
        piece = measure(model, card, images[first:first + PROGRESS_EVERY])
        for reading, by_layer in piece.items():
            for name, numbers in by_layer.items():
                done = measured.setdefault(reading, {}).get(name)
                measured[reading][name] = numbers if done is None else np.concatenate([done, numbers])
        print(f"{min(first + PROGRESS_EVERY, len(images))} of {len(images)} patches", file=sys.stderr, flush=True)
    if not measured:
        print(f"error: {args.checkpoint} has no attentive layer: nothing to compare with nuclei", file=sys.stderr)
        return 1
    sample = f" (a random sample, seed {args.seed})" if len(chosen) < len(splits.test) else ""
    measured_on = (f"{len(chosen)} of the {len(splits.test)} test patches of {card['dataset']['name']}{sample}, "
                   "identity transform")
    command = "python -m benchmarks.attention_on_nuclei " + shlex.join(sys.argv[1:] if argv is None else argv)
    entry = card_entry(measured, measured_on, command)
    print(measured_on)
    print_summary(entry["readings"])
    if args.per_patch:
        write_rows(args.per_patch, names, measured)
    if args.write_card or args.results_card:
        written = args.results_card or card_path(args.checkpoint)
        edit_card(written, lambda data: data.__setitem__("attention_on_nuclei", entry))
        print(f"wrote the measurement into {written} (its test record, where it has one, bound to it again)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
