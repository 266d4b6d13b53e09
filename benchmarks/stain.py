"""Stain stability of the PCam models: accuracy, AUC and attention when the colours move, and what normalisation
gives back.

    python -m benchmarks.stain [--limit N] [--threads 1] [--cache DIR] [--stems STEM ...]

On the 1,944 test patches of ``../shared/data/pcam_public`` (the cards' data_dir), for the shipped default
``fa_p4m_densenet_pcam`` and ``p4m_densenet_pcam``, under every condition of :mod:`benchmarks.stain_conditions`:
as scanned, re-stained to each real slide's estimated stain (``app.slides.stain.slide_stain`` of
``../shared/data/slides``), HED jitter at Tellez's light and strong sizes; each of them as it is and normalised back
to PCam's reference (``pcam_reference()``) with Macenko and with Reinhard, from each patch's own estimate and from one
estimate of the condition's patches pooled (as the Slide page normalises a slide). Prints accuracy and AUC with the
project's 95 % intervals (:func:`training.metrics.confidence_intervals`), the mean absolute change of P(tumour) and
of the first attentive layer's alpha_s against the patch as scanned, the share of predictions that flip, and the
goal: the share of the AUC lost to re-staining that normalisation recovers (at least 80 %), PASS or NOT MET.

The probabilities are the evaluator's (the card's normalisation, batches of 256, softmax float32), with the first
attentive layer traced in the same pass. Each (model, condition) is written to the cache folder when done (named
by a hash of everything that defines it), so an interrupted run restarts from what is done.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import models.stain as stain_maths
import models.stain_normalise as stain_normalise
from app.analysis.stain_stability import first_spatial_layer  # the patch page's Stain tab's layer
from benchmarks.stain_conditions import (
    GOAL,
    NORMALISATIONS,
    POOLED,
    TRUE,
    Perturbation,
    applies,
    condition_images,
    condition_key,
    normalisation_label,
    perturbations,
    recovery,
    resampled_recovery,
    verdict,
)
from benchmarks.train_step import instruction_sets
from experiments.patch_records import BATCH_SIZE, listing_sha256, tumour_intervals
from models import load_checkpoint
from models.stain_normalise import StainEstimate, pcam_reference
from training.atomic import write_atomic
from training.data import ArraySplit, load_dataset
from training.evaluation import Normaliser
from training.provenance import _cpu_name, sha256_file

REPO = Path(__file__).resolve().parents[1]
STEMS = ("fa_p4m_densenet_pcam", "p4m_densenet_pcam")
SLIDES = {"CMU-1": "CMU-1-Small-Region.svs", "TCGA frozen": "tcga-cr-7395-01a-01-ts1.svs"}
COMMAND = "python -m benchmarks.stain"
# The stain code that runs (read once, as it is imported: the files may change under a long run).
STAIN_CODE = [sha256_file(Path(module.__file__)) for module in (stain_normalise, stain_maths)]


def cpu_line() -> str:
    """The CPU's name, whether it has AVX-512 (``avx512f``) and the instruction sets the code dispatches to."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        flags = ""
    avx512 = "avx512f present" if " avx512f" in flags else "no avx512f"
    return f"CPU: {_cpu_name()}, {os.cpu_count()} cores, {avx512} | {instruction_sets()}"


def evaluate(model, card: dict, images: np.ndarray, layer: str | None) -> tuple[np.ndarray, np.ndarray | None]:
    """float32 P(tumour) ``(N,)`` and, for ``layer``, its alpha_s ``(N, X, Y)`` (the mean over any other axis).

    The evaluator's steps (:func:`training.evaluation.predict`): the split's [0, 1] floats, the card's
    normalisation, batches of :data:`BATCH_SIZE`, softmax in float32; the layer traced in the same forward pass.
    """
    split = ArraySplit(images, np.zeros(len(images), dtype=np.int64))
    normalise = Normaliser.for_card(card, torch.device("cpu"))
    tumour, maps = [], []
    model.eval()
    with torch.inference_mode():
        for start in range(0, len(images), BATCH_SIZE):
            batch, _ = split.get_batch(np.arange(start, min(start + BATCH_SIZE, len(images))))
            logits, trace = model.trace(normalise(batch), record=() if layer is None else (layer,))
            tumour.append(torch.softmax(logits.float(), dim=1)[:, 1].numpy().astype(np.float32))
            if layer is not None:
                spatial = trace.attention[layer].spatial  # (B, ..., X, Y): input attention has (B, 1, X, Y)
                maps.append(spatial.float().reshape(len(batch), -1, *spatial.shape[-2:]).mean(dim=1).numpy())
    return np.concatenate(tumour), (np.concatenate(maps) if layer is not None else None)


class Cache:
    """One ``.npz`` per (model, condition), named by the hash of everything that defines its numbers."""

    def __init__(self, folder: Path, identity: dict):
        self.folder = Path(folder)
        self.identity = identity

    def path(self, stem: str, what: dict) -> Path:
        key = json.dumps({**self.identity, "stem": stem, **what}, sort_keys=True)
        return self.folder / f"{stem}-{what['condition']}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.npz"

    def load(self, stem: str, what: dict) -> dict | None:
        path = self.path(stem, what)
        try:
            with np.load(path) as f:
                return {name: f[name] for name in f.files}
        except (OSError, ValueError, EOFError):
            return None  # not done yet, or a foreign or truncated file: measured again

    def save(self, stem: str, what: dict, **arrays) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        write_atomic(self.path(stem, what), buffer.getvalue())


def measure_condition(model, card, layer, changed: np.ndarray, scanned_maps: np.ndarray | None) -> dict:
    """One model on one condition's patches: tumour ``(N,)``, alpha_change ``(N,)`` (mean |alpha_s - scanned's|
    per patch; empty without attention), the maps themselves and the model's seconds."""
    started = time.perf_counter()
    tumour, maps = evaluate(model, card, changed, layer)
    alpha_change = (np.abs(maps - scanned_maps).mean(axis=(1, 2)) if maps is not None and scanned_maps is not None
                    else np.zeros(0, dtype=np.float32))
    return {"tumour": tumour, "alpha_change": alpha_change, "maps": maps,
            "model_s": np.float64(time.perf_counter() - started)}


def summarise(result: dict, scanned: np.ndarray, labels: np.ndarray) -> dict:
    """Accuracy and AUC with their 95 % intervals, and the changes against the patches as scanned."""
    intervals = tumour_intervals(result["tumour"], labels)
    tumour = result["tumour"].astype(np.float64)
    return {"accuracy": intervals["accuracy"], "auc": intervals["auc"],
            "mean_abs_dp": float(np.abs(tumour - scanned).mean()),
            "mean_abs_dalpha": float(result["alpha_change"].mean()) if result["alpha_change"].size else None,
            "flipped": float(np.mean((tumour > 0.5) != (scanned > 0.5))),
            "not_done": int((~result["done"]).sum()),
            "seconds": result["seconds"].tolist()}


def run(loaded: dict, images: np.ndarray, labels: np.ndarray, slides: dict[str, StainEstimate],
        reference: StainEstimate, cache: Cache | None = None, methods=NORMALISATIONS, only: set[str] | None = None,
        measure: bool = True, log=None) -> dict:
    """Every condition on every model: ``{stem: {"layer", "conditions": {key: summary}, "recovery": {...}}}``.

    Args:
        loaded: ``{stem: (model, card)}``.
        images: uint8 ``(N, 3, H, W)`` test patches, the first N of the split; labels ``(N,)``.
        slides: ``{short name: estimate}`` of the slides to re-stain to.
        cache: where each condition is kept when done (None: nothing kept).
        only: the condition keys to run (None: all); ``scanned+none`` always runs, every change is against it.
        measure: False: report only what the cache holds (a condition not measured yet is left out).
        log: called with a line of progress after each condition.

    The goal's conditions (as scanned and re-stained, each normalised) run first on every model, the jitter last,
    so that an interrupted run has the goal.
    """
    indices = np.arange(len(images))
    plan = perturbations(slides, pcam_reference())  # the patches' own set: PCam
    wanted = [(p, m) for p in plan for m in methods if applies(p, m)
              and (only is None or condition_key(p, m) in only or (p is plan[0] and m == "none"))]
    # The goal's conditions of each model in turn (the default first), then the jitter, so that an interrupted run
    # has the default model's goal first. Each condition's patches are made once and kept for the next model.
    stems = list(loaded)
    order = sorted(((stem, p, m) for stem in stems for p, m in wanted),
                   key=lambda c: (_priority(*c[1:]) == 4, stems.index(c[0]), _priority(*c[1:])))
    raw: dict[str, dict[str, dict]] = {stem: {} for stem in loaded}
    maps: dict[str, np.ndarray | None] = {}  # each model's alpha_s as scanned: what every change is against
    made: dict[str, dict] = {}  # condition -> its pixels' sha256, done, colour seconds (and the patches once made)
    for stem, perturbation, method in order:
        model, card = loaded[stem]
        key = condition_key(perturbation, method)
        definition = colour_definition(perturbation, method, reference)
        if key not in made:
            # The patches' digest, kept by what defines them, so that a run finds a model's cached outputs without
            # making the patches again.
            made[key] = (cache.load("colours", definition) if cache else None) or {}
        if "pixels" not in made[key]:
            if not measure:
                continue  # never made, so never measured
            made[key] = _make(images, indices, perturbation, method, reference)
            if cache:
                cache.save("colours", definition, **{k: v for k, v in made[key].items() if k != "patches"})
        layer = first_spatial_layer(model)
        scanned = key == "scanned+none"  # each model's first condition
        # Named by the pixels the models see: a change of the stain code that leaves them alike keeps the cache.
        what = {"condition": key, "pixels": str(made[key]["pixels"]), "layer": layer, "model": model_identity(card)}
        result = cache.load(stem, what) if cache else None
        if result is None:
            if not measure:
                continue
            if "patches" not in made[key]:
                made[key] = _make(images, indices, perturbation, method, reference)
            result = measure_condition(model, card, layer, made[key]["patches"], maps.get(stem))
            if scanned and result["maps"] is not None:
                result["alpha_change"] = np.zeros(len(images), dtype=np.float32)
            if not scanned or result["maps"] is None:
                result.pop("maps")  # only the scanned maps are kept: 36 KB a patch
            if cache:
                cache.save(stem, what, **result)
        if scanned:
            maps[stem] = result.get("maps")
        colour_s = float(made[key]["colour_s"])
        seconds = np.array([colour_s, float(result["model_s"])])
        raw[stem][key] = {**result, "done": made[key]["done"], "seconds": seconds}
        if log:
            log(f"{stem} {key}: colours {colour_s:.0f} s, model {float(result['model_s']):.0f} s")
    missing = {stem: [condition_key(p, m) for p, m in wanted if condition_key(p, m) not in raw[stem]] for stem in stems}
    return {stem: {**_model_summary(loaded[stem][0], raw[stem], labels, plan, methods), "missing": missing[stem]}
            for stem in stems}


def colour_definition(perturbation: Perturbation, method: str, reference: StainEstimate) -> dict:
    """What defines a condition's patches: the perturbation, the method, the reference and the stain code."""
    return {"condition": condition_key(perturbation, method), "perturbation": perturbation.describe(),
            "method": method, "reference": None if method == "none" else reference.to_dict(),
            "stain_code": STAIN_CODE}


def _make(images, indices, perturbation: Perturbation, method: str, reference: StainEstimate) -> dict:
    """One condition's patches, which went through every step, the seconds it took and the patches' sha256."""
    started = time.perf_counter()
    patches, done = condition_images(images, indices, perturbation, method, reference)
    return {"patches": patches, "done": done, "colour_s": np.float64(time.perf_counter() - started),
            "pixels": np.str_(hashlib.sha256(np.ascontiguousarray(patches).tobytes()).hexdigest())}


def _priority(perturbation: Perturbation, method: str) -> int:
    """Which conditions a run measures first: as scanned; the goal's re-stained sets, plain and with Macenko (each
    patch's estimate and the set's); with Reinhard; as scanned and normalised; the jitter."""
    if perturbation.target is not None:
        return 1 if method.removesuffix(POOLED) in ("none", "macenko") else 2
    if perturbation.jitter:
        return 4
    return 0 if method == "none" else 3


def _model_summary(model, raw: dict, labels, plan, methods) -> dict:
    if "scanned+none" not in raw:
        return {"layer": first_spatial_layer(model), "conditions": {}, "recovery": {}}
    scanned = raw[condition_key(plan[0], "none")]["tumour"].astype(np.float64)
    conditions = {key: {"label": next(p.label for p in plan if key.startswith(p.key + "+")),
                        "method": normalisation_label(key.split("+")[1]), **summarise(result, scanned, labels)}
                  for key, result in raw.items()}
    goal = {}
    auc = {key: c["auc"]["value"] for key, c in conditions.items()}
    for p in plan:
        restained = condition_key(p, "none")
        if p.target is None or restained not in raw:
            continue
        for method in methods:
            normalised = condition_key(p, method)
            if method == "none" or normalised not in raw:
                continue
            share = recovery(auc["scanned+none"], auc[restained], auc[normalised])
            interval = resampled_recovery(labels, scanned, raw[restained]["tumour"].astype(np.float64),
                                          raw[normalised]["tumour"].astype(np.float64))
            goal[normalised] = {"slide": p.label, "method": normalisation_label(method), "share": share,
                                "interval": interval, "verdict": "ceiling" if method == TRUE else verdict(share)}
    return {"layer": first_spatial_layer(model), "conditions": conditions, "recovery": goal}


def _interval(m: dict) -> str:
    return f"{m['value']:.4f} [{m['low']:.4f}, {m['high']:.4f}]"


def table(stem: str, summary: dict, count: int) -> list[str]:
    """The Markdown table of one model's conditions and its goal lines."""
    layer = summary["layer"]
    alpha = f"mean abs Δα_s ({layer})" if layer else "mean abs Δα_s"
    lines = [f"### {stem} ({count:,} test patches)", "",
             f"| condition | normalised | accuracy [95 % CI] | AUC [95 % CI] | mean abs ΔP(tumour) | {alpha} | "
             "flipped | estimate failed |",
             "|---|---|---|---|---|---|---|---|"]
    for c in summary["conditions"].values():
        dalpha = "—" if c["mean_abs_dalpha"] is None else f"{c['mean_abs_dalpha']:.4f}"
        lines.append(f"| {c['label']} | {c['method']} | {_interval(c['accuracy'])} | {_interval(c['auc'])} | "
                     f"{c['mean_abs_dp']:.4f} | {dalpha} | {100 * c['flipped']:.1f} % | {c['not_done']} |")
    if summary.get("missing"):
        lines.append("")
        lines.append(f"Not measured yet: {', '.join(summary['missing'])} (`{COMMAND}` measures them).")
    if not layer:
        lines.append("")
        lines.append(f"{stem} has no attentive layer: no α_s to compare.")
    lines.append("")
    for g in summary["recovery"].values():
        share = "—" if g["share"] is None else f"{100 * g['share']:.0f} %"
        interval = ("" if g["interval"] is None
                    else f" (95 % bootstrap [{100 * g['interval'][0]:.0f} %, {100 * g['interval'][1]:.0f} %])")
        if g["verdict"] == "ceiling":
            lines.append(f"- ceiling, {g['slide']}: normalising back from the slide's true stain (the re-staining's "
                         f"inverse) recovers {share}{interval} of the AUC lost; the rest went with the re-stained "
                         f"pixels' 8-bit rounding and clipping")
        else:
            lines.append(f"- goal, {g['slide']}, {g['method']}: recovers {share}{interval} of the AUC lost "
                         f"(goal >= {100 * GOAL:.0f} %): **{g['verdict']}**")
    return lines


def cache_identity(test, count: int) -> dict:
    """What every cached condition depends on besides its pixels and its model: the patches' names and labels and
    the batch size."""
    return {"files_labels": listing_sha256(test.names[:count], test.labels[:count]), "count": count,
            "batch": BATCH_SIZE}


def model_identity(card: dict) -> list:
    """What a model's outputs depend on: its architecture, weights (the card's digest of its tensors: a card edited
    around the same weights keeps the cache) and input normalisation."""
    return [card["arch"], card.get("weights_sha256"), card["input"]]


def slide_estimates(folder: Path) -> dict[str, StainEstimate]:
    """Each real slide's estimated stain, by the app's ``slide_stain``."""
    from app.slides.stain import slide_stain

    return {name: slide_stain(folder / file) for name, file in SLIDES.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stems", nargs="+", default=list(STEMS), help=f"checkpoints (default {' '.join(STEMS)})")
    parser.add_argument("--limit", type=int, default=0, help="the first N test patches only (0: all 1,944)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "aagc-benchmark-stain",
                        help="folder for each finished condition (default: the system's temporary folder)")
    parser.add_argument("--slides", type=Path, default=REPO.parent / "shared" / "data" / "slides",
                        help="folder of the two real slides")
    parser.add_argument("--report", action="store_true",
                        help="print what the cache holds, measuring nothing (a condition not measured is named)")
    parser.add_argument("--only", nargs="+", metavar="CONDITION",
                        help="measure these conditions only (e.g. 'restain_CMU-1+macenko'; as scanned always runs)")
    parser.add_argument("--reference", type=Path,
                        help="a JSON stain estimate to normalise to (StainEstimate.to_dict; default: pcam_reference())")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.limit < 0:
        parser.error("--limit must be 0 (all patches) or positive")
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    loaded = {}
    for stem in args.stems:
        path = REPO / "checkpoints" / f"{stem}.safetensors"
        if not path.is_file():
            parser.error(f"no checkpoint {path.relative_to(REPO)}")
        loaded[stem] = load_checkpoint(path)
    data_dirs = {card["training"]["config"]["data_dir"] for _, card in loaded.values()}
    if len(data_dirs) != 1:
        parser.error(f"the checkpoints name different data folders ({', '.join(sorted(data_dirs))})")
    test = load_dataset("pcam_public", REPO / data_dirs.pop()).test
    count = min(args.limit or len(test), len(test))
    images, labels = test.images[:count], test.labels[:count]
    slides = slide_estimates(args.slides)
    try:
        reference = (StainEstimate.from_dict(json.loads(args.reference.read_text())) if args.reference
                     else pcam_reference())
    except (OSError, ValueError) as error:  # StainError is a ValueError: its sentence is the message
        parser.error(f"no reference stain to normalise to: {error}")
    stain_code = STAIN_CODE[0]
    cache = Cache(args.cache, cache_identity(test, count))
    print(cpu_line(), flush=True)
    print(f"torch {torch.__version__}, {args.threads} thread(s); {count:,} test patches; models/stain_normalise.py "
          f"sha256 {stain_code[:12]}; cache {args.cache}", flush=True)
    for name, estimate in {"PCam reference": reference, **slides}.items():
        print(f"{name}: H {np.round(estimate.vectors[0], 3).tolist()}, E {np.round(estimate.vectors[1], 3).tolist()}, "
              f"99th-percentile concentrations {np.round(estimate.max_concentrations, 3).tolist()}", flush=True)
    known = [condition_key(p, m) for p in perturbations(slides, pcam_reference()) for m in NORMALISATIONS
             if applies(p, m)]
    if set(args.only or ()) - set(known):
        parser.error(f"no condition {', '.join(sorted(set(args.only) - set(known)))}; the conditions are "
                     f"{', '.join(known)}")
    results = run(loaded, images, labels, slides, reference, cache, only=set(args.only) if args.only else None,
                  measure=not args.report, log=lambda line: print(line, flush=True))
    print()
    for stem, summary in results.items():
        print("\n".join(table(stem, summary, count)))
        print()
    print(f"{cpu_line()}; {args.threads} thread(s); {time.perf_counter() - started:.0f} s in all "
          f"(conditions read back from the cache count as 0 s). Command: {COMMAND}"
          + (f" --limit {args.limit}" if args.limit else ""))
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu_line(), "patches": count, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
