"""Where the PCam DenseNets spend a training step and an inference batch: by operator and by layer.

    python -m benchmarks.densenet_profile [--baseline 4ba8abb] [--models densenet p4m_densenet fa_p4m_densenet]
        [--batch 64] [--threads 2] [--top 8] [--markdown out.md]

For each model and for the models package of this tree (freed memory kept, as training runs) and (with
``--baseline``) of a baseline commit (glibc's default allocator), in a fresh process each (as
``benchmarks.densenet_step``): one warm-up, then

* by operator: ``torch.profiler`` over one step, the operators with the most self CPU time;
* by layer: one step timed with hooks, not profiled (the profiler's own cost would be counted): each top-level
  layer's forward (from its pre-hook to its hook) and backward (from the gradient reaching its output to the
  gradient leaving its input; the CPU autograd engine runs them one after another).

Prints markdown tables: the figures docs/speed.md quotes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parent.parent))  # after the worker's PYTHONPATH (its models)

from benchmarks.densenet_step import BASELINE, MODELS, build_step, extract, worker_result  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def top_layers(model) -> list[tuple[str, object]]:
    """The DenseNet's layers in forward order: the lifting layer, each dense block, each transition, the output."""
    names = ["c1"]
    for i in range(len(model.block_layers)):
        names.append(f"block_layers.{i}")
        if i < len(model.trans_layers):
            names.append(f"trans_layers.{i}")
    names.append("c_out")
    return [(name, model.get_submodule(name)) for name in names]


def tensor_of(value):
    """A layer's input or output, or the first of a dense block's parts (their gradients come and go together:
    the concatenation's backward hands both out at once)."""
    return value[0] if isinstance(value, tuple) else value


def layer_times(model, step) -> dict[str, dict[str, float]]:
    """Seconds per top-level layer, forward and backward, over one call of ``step``."""
    times = {name: {"forward": 0.0, "backward": None} for name, _ in top_layers(model)}
    marks: dict[str, float] = {}
    handles = []

    def watch(name):
        def before(module, args):
            marks[name] = time.perf_counter()
            first = tensor_of(args[0]) if args else None
            if first is not None and first.requires_grad:
                # Fires when the gradient leaves this layer's input: its backward is done.
                # (None where the input needs no gradient, as the image entering c1.)
                first.register_hook(lambda grad: times[name].__setitem__(
                    "backward", time.perf_counter() - marks.pop(name + "/bwd")))

        def after(module, args, out):
            times[name]["forward"] += time.perf_counter() - marks.pop(name)
            out = tensor_of(out)
            if out.requires_grad:
                out.register_hook(lambda grad: marks.__setitem__(name + "/bwd", time.perf_counter()))
        return before, after

    for name, module in top_layers(model):
        before, after = watch(name)
        handles += [module.register_forward_pre_hook(before), module.register_forward_hook(after)]
    try:
        step()
    finally:
        for handle in handles:
            handle.remove()
    return times


def measure(name: str, mode: str, batch: int, threads: int, top: int, keep_freed: bool = False) -> dict:
    """A worker: operator and layer profile of one model's training step or inference batch."""
    from torch.profiler import ProfilerActivity, profile

    model, step = build_step(name, mode, batch, threads, keep_freed)
    step()
    start = time.perf_counter()
    step()
    total = time.perf_counter() - start
    layers = layer_times(model, step)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    profiled = sum(e.self_cpu_time_total for e in events) / 1e6
    operators = [{"name": e.key, "seconds": e.self_cpu_time_total / 1e6, "calls": e.count} for e in events[:top]]
    return {"seconds": total, "profiled_seconds": profiled, "operators": operators, "layers": layers}


def run_worker(code: Path, name: str, mode: str, args, keep_freed: bool) -> dict:
    return worker_result(code, str(Path(__file__).resolve()), name, "--mode", mode, "--batch", str(args.batch),
                         "--threads", str(args.threads), "--top", str(args.top),
                         *(["--keep-freed"] if keep_freed else []))


def tables(name: str, mode: str, results: dict[str, dict]) -> list[str]:
    """Markdown: operators and layers, one column pair per code version."""
    labels = list(results)
    lines = [f"#### {name}, {'training step' if mode == 'train' else 'inference batch'}", ""]
    lines.append("| | " + " | ".join(f"{label}: {results[label]['seconds']:.2f} s" for label in labels) + " |")
    lines.append("|---|" + "---|" * len(labels))
    rows = max(len(r["operators"]) for r in results.values())
    for i in range(rows):
        cells = []
        for label in labels:
            ops, profiled = results[label]["operators"], results[label]["profiled_seconds"]
            cells.append(f"{ops[i]['name']} {100 * ops[i]['seconds'] / profiled:.0f} %" if i < len(ops) else "")
        lines.append(f"| operator {i + 1} | " + " | ".join(cells) + " |")
    for layer in results[labels[0]]["layers"]:
        cells = []
        for label in labels:
            t = results[label]["layers"][layer]
            backward = "-" if t["backward"] is None else f"{1000 * t['backward']:.0f}"
            cells.append(f"{1000 * t['forward']:.0f} + {backward} ms" if mode == "train"
                         else f"{1000 * t['forward']:.0f} ms")
        lines.append(f"| `{layer}` | " + " | ".join(cells) + " |")
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help=f"also profile the models package of this commit (e.g. {BASELINE})")
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--modes", nargs="+", default=["train", "infer"], choices=["train", "infer"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--keep-freed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(measure(args.worker, args.mode, args.batch, args.threads, args.top, args.keep_freed)))
        return 0
    out = [f"batch {args.batch}, {args.threads} threads, load avg {os.getloadavg()[0]:.1f}; a layer's time is "
           "forward + backward", ""]
    failed = False
    with tempfile.TemporaryDirectory() as scratch:
        codes = {"after": REPO}
        if args.baseline:
            extract(args.baseline, Path(scratch))
            codes = {f"before ({args.baseline})": Path(scratch), "after": REPO}
        for name in args.models:
            for mode in args.modes:
                # "after" keeps freed memory as training does; the baseline ran with glibc's default
                results = {label: run_worker(code, name, mode, args, keep_freed=label == "after")
                           for label, code in codes.items()}
                errors = [r["error"] for r in results.values() if "error" in r]
                if errors:
                    out.append(f"{name} {mode}: FAILED: {errors[0]}")
                    failed = True
                else:
                    out += tables(name, mode, results)
    text = "\n".join(out)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
