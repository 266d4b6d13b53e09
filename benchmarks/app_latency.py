"""Latency of the app: a new image to every panel computed and every figure built, per checkpoint, on CPU.

For each checkpoint (``checkpoints/*.safetensors``, or ``--checkpoints DIR``) or
registry model with random weights (``--models``), this times what the page
does for a new image in its default view, with the functions the UI calls and
without Streamlit:

* ``read``: the image's bytes decoded and fitted to the model's input
  (:func:`app.analysis.images.read_image`, :func:`app.analysis.images.fit_to_model`);
* ``analyse``: one batched forward pass over every group transform, every
  layer's maps and the proof (:func:`app.analysis.compute.analyse`);
* ``maps``: the turn viewer's payload of the default layer, as JSON (:func:`app.ui.views.maps_payload`);
* ``arrows``: the default arrow field and its picture for every transform, an SVG
  (:func:`app.ui.views.default_arrow_field`, :func:`app.ui.views.arrows_svg`);
* ``proof``: the proof figure of the first non-identity transform (:func:`app.pictures.plots.proof_figure`);
* ``prediction``: the probability chart, and the reliability diagram for pathology models;
* ``nuclei``: for pathology models, the "Attention on nuclei" tab (the first attentive layer against
  haematoxylin and background, :func:`app.analysis.nuclei.attention_on_nuclei`, and its figure);
* ``serialise``: every plotly figure checked and turned into JSON as ``st.plotly_chart`` does.

Besides, ``forward`` times the network's traced forward pass over the same
batch on its own (not part of the total): the part of ``analyse`` that the app
cannot make faster. The app keeps freed memory for reuse
(:mod:`models.cpu.allocator`); ``default malloc`` times the same forward passes,
measured first in the same run, with glibc's default allocator.

Every repeat uses a new image (a gallery image of the model's kind, shifted
and with fresh noise), so no cache could answer. The first run (not counted)
warms up. Reported: median and min per stage and in total, over ``--repeats``.
The goal of the app issue is a total of at most 0.3 s for the 96 x 96 p4m
DenseNet (``fa_p4m_densenet``) on a 2-core CPU; its line says PASS or FAIL.

Measure on an idle machine. Beside other busy processes two threads wait for
each other at every operation's barrier (a 5 us matrix product took 16 ms with
two threads under three trainings, 0.02 ms with one): ``--threads 1`` then
gives steadier numbers for comparing versions.

Run from the repository root::

    python -m benchmarks.app_latency                        # checkpoints/
    python -m benchmarks.app_latency --checkpoints /tmp/ckpts --repeats 7
    python -m benchmarks.app_latency --models fa_p4m_densenet a_p4cnn --json out/app_latency.json
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import plotly.io as pio  # noqa: E402
import plotly.tools  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

import models  # noqa: E402
from app.analysis.compute import Analysis, analyse  # noqa: E402
from app.analysis.frames import InputFrame  # noqa: E402
from app.analysis.images import fit_to_model, read_image  # noqa: E402
from app.analysis.nuclei import attention_on_nuclei  # noqa: E402
from app.analysis.pathology import is_pathology  # noqa: E402
from app.gallery import list_gallery  # noqa: E402
from app.pictures.plots import (  # noqa: E402
    probability_figure,
    proof_figure,
    reliability_figure,
)
from app.ui.views import (  # noqa: E402
    Display,
    arrows_svg,
    default_arrow_field,
    default_layer_key,
    maps_payload,
    nuclei_panels,
    orientation_titles,
    panel_marks,
    proof_range,
    value_range,
)
from benchmarks.train_step import instruction_sets  # noqa: E402
from models.cpu.allocator import retain_freed_memory  # noqa: E402

GOAL_MODEL = "fa_p4m_densenet"
GOAL_SECONDS = 0.3
STAGES = ("read", "analyse", "maps", "arrows", "proof", "prediction", "nuclei", "serialise")
PCAM_RELIABILITY = {"bin_edges": np.linspace(0.5, 1.0, 6).tolist(), "confidence": [0.55, 0.65, 0.75, 0.85, 0.97],
                    "accuracy": [0.5, 0.6, 0.7, 0.9, 0.98], "count": [10, 12, 20, 40, 176]}


def random_card(arch: str) -> dict:
    """A card for a registry model with random weights: its dataset's input convention and class names."""
    info = models.model_info(arch)
    if info.dataset == "rot_mnist":
        return {"input": dict(size=info.input_size, channels=1, mean=[0.1307], std=[0.3081], transposed=False),
                "dataset": {"name": "rot_mnist"}, "class_names": [str(i) for i in range(10)]}
    if info.dataset == "pcam":
        return {"input": dict(size=info.input_size, channels=3, mean=[0.7, 0.55, 0.7], std=[0.2, 0.25, 0.2],
                              transposed=False),
                "dataset": {"name": "pcam"}, "class_names": ["normal", "tumour"],
                "metrics": {"test_reliability": PCAM_RELIABILITY}}
    return {"input": dict(size=info.input_size, channels=3, mean=[0.5] * 3, std=[0.25] * 3, transposed=False),
            "dataset": {"name": info.dataset}, "class_names": [str(i) for i in range(10)]}


def new_image_bytes(card: dict, repeat: int) -> bytes:
    """A PNG that no cache has seen: a gallery image of the model's kind, rolled and with fresh noise."""
    kind = "he" if is_pathology(card) or card["input"]["channels"] == 3 else "digit"
    items = list_gallery(kind=kind) or list_gallery()
    rng = np.random.default_rng(1000 + repeat)
    with Image.open(items[repeat % len(items)].path) as img:
        pixels = np.asarray(img.convert("RGB" if kind == "he" else "L"), dtype=np.float32)
    pixels = np.roll(pixels, (repeat, 2 * repeat), axis=(0, 1)) + rng.normal(0, 4, pixels.shape)
    buffer = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def page(model: models.Network, card: dict, data: bytes, clock: Callable[[], float] = time.perf_counter) -> dict:
    """Everything the page computes and builds for a new image in its default view; seconds per stage."""
    times: dict[str, float] = {}
    start = clock()
    spec = card["input"]
    fitted = fit_to_model(read_image(data), int(spec["size"]), int(spec["channels"]))
    times["read"] = clock() - start

    start = clock()
    current: Analysis = analyse(model, card, fitted.pixels, 0, {})
    times["analyse"] = clock() - start

    start = clock()
    kind, name = default_layer_key(current).split("/", 1)
    layer = getattr(current, kind)[name]
    size = current.images.shape[-1]
    # The page's defaults; the padding borders are measured once per model, not per image, and left at 0 here.
    display = Display(range_mode="equalised" if is_pathology(card) else "robust")
    zrange = value_range(layer, display, size)
    marks = panel_marks(card, size, None)
    json.dumps(maps_payload(current, layer, display, zrange, marks))  # the component's data, serialised as sent
    times["maps"] = clock() - start

    start = clock()
    figures = []
    _, field = default_arrow_field(current, {})
    if field is not None:
        arrows_svg(field, current)
    times["arrows"] = clock() - start

    start = clock()
    t = 1
    proof_zrange = proof_range(layer, display, size)
    figures.append(proof_figure(current.images[t], layer.maps[t], layer.expected[t], orientation_titles(current, layer),
                                colorscale="Viridis", zmin=proof_zrange[0], zmax=proof_zrange[1]))
    times["proof"] = clock() - start

    start = clock()
    figures.append(probability_figure(current.probabilities, list(current.class_names), list(current.element_names)))
    reliability = (card.get("metrics") or {}).get("test_reliability")
    if is_pathology(card) and reliability:
        figures.append(reliability_figure(reliability, float(current.probabilities[0].max())))
    times["prediction"] = clock() - start

    start = clock()
    nuclei = attention_on_nuclei(current) if is_pathology(card) else None
    if nuclei is not None:  # the tab's figure
        figures.append(nuclei_panels(current, nuclei))
    times["nuclei"] = clock() - start

    start = clock()
    for figure in figures:
        if hasattr(figure, "to_plotly_json"):  # what st.plotly_chart does with a figure
            pio.to_json(plotly.tools.return_figure_from_figure_or_data(figure, validate_figure=True), validate=False)
    times["serialise"] = clock() - start
    times["total"] = sum(times[s] for s in STAGES)
    times["forward"] = forward_seconds(model, card, current.images, clock)
    return times


def forward_seconds(model: models.Network, card: dict, images: np.ndarray, clock=time.perf_counter) -> float:
    """The network's traced forward pass alone over the batch of every transform of an image."""
    batch = InputFrame.from_card(card, model.group).to_network(torch.from_numpy(images))
    start = clock()
    with torch.inference_mode():
        model.trace(batch)
    return clock() - start


def transformed_images(model: models.Network, card: dict, repeat: int) -> np.ndarray:
    spec = card["input"]
    fitted = fit_to_model(read_image(new_image_bytes(card, repeat)), int(spec["size"]), int(spec["channels"]))
    return analyse(model, card, fitted.pixels, 0, {}).images


def default_allocator_forward(model: models.Network, card: dict, repeats: int) -> list[float]:
    """Forward seconds before :func:`retain_freed_memory`: glibc's default, freed blocks returned to the system."""
    forward_seconds(model, card, transformed_images(model, card, -1))  # warm-up
    return [forward_seconds(model, card, transformed_images(model, card, r)) for r in range(repeats)]


def measure(name: str, model: models.Network, card: dict, repeats: int, default_forward: list[float]) -> dict:
    page(model, card, new_image_bytes(card, -1))  # warm-up: first-call allocations, lazy imports
    runs = [page(model, card, new_image_bytes(card, r)) | {"forward_default_malloc": default_forward[r]}
            for r in range(repeats)]
    keys = (*STAGES, "total", "forward", "forward_default_malloc")
    return {"name": name, "arch": card.get("arch", name), "size": card["input"]["size"], "repeats": repeats,
            "median_s": {k: statistics.median(run[k] for run in runs) for k in keys},
            "min_s": {k: min(run[k] for run in runs) for k in keys}}


def targets(args) -> list[tuple[str, Callable[[], tuple[models.Network, dict]]]]:
    if args.models:
        def random_model(arch: str):
            torch.manual_seed(0)
            return models.build_model(arch).eval(), {"arch": arch, **random_card(arch)}
        return [(f"{arch} (random weights)", lambda arch=arch: random_model(arch)) for arch in args.models]
    paths = sorted(Path(args.checkpoints).glob("*.safetensors"))
    return [(path.stem, lambda path=path: models.load_checkpoint(path)) for path in paths]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoints", default=os.environ.get("APP_CHECKPOINTS", "checkpoints"),
                        help="folder of *.safetensors checkpoints (default: $APP_CHECKPOINTS or checkpoints)")
    parser.add_argument("--models", nargs="+", choices=models.list_models(), metavar="NAME",
                        help="registry models with random weights instead of checkpoints, e.g. fa_p4m_densenet")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    found = targets(args)
    if not found:
        print(f"no checkpoints in {args.checkpoints}/; use --models NAME ... for registry models with random weights")
        return 1
    loaded = [(name, *load()) for name, load in found]
    # First every forward pass with glibc's default allocator, then as the app runs (it retains freed memory).
    default_forward = {name: default_allocator_forward(model, card, args.repeats) for name, model, card in loaded}
    retained = retain_freed_memory()
    print(f"torch {torch.__version__}, {args.threads} threads, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs; seconds per new image, median (min) of {args.repeats}; freed memory retained "
          f"as in the app: {'yes' if retained else 'no (not glibc)'}; (forward) and (default malloc): the forward "
          "pass alone, as the app runs and with glibc's default allocator")
    engine = "orjson" if importlib.util.find_spec("orjson") else "json (orjson missing: slower serialise)"
    print(f"{instruction_sets()}; plotly's JSON engine: {engine}")
    columns = (*STAGES, "total", "(forward)", "(default malloc)")
    print(f"{'model':34s} " + " ".join(f"{s:>16s}" for s in columns))
    results = []
    for name, model, card in loaded:
        result = measure(name, model, card, args.repeats, default_forward[name])
        results.append(result)
        keys = (*STAGES, "total", "forward", "forward_default_malloc")
        cells = [f"{result['median_s'][k]:7.3f} ({result['min_s'][k]:.3f})" for k in keys]
        verdict = ""
        if result["arch"] == GOAL_MODEL and result["size"] == 96:
            verdict = f"  goal <= {GOAL_SECONDS} s: {'PASS' if result['median_s']['total'] <= GOAL_SECONDS else 'FAIL'}"
        print(f"{name:34s} " + " ".join(f"{c:>16s}" for c in cells) + verdict)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
