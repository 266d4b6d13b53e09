"""Time and peak memory of one training step per architecture, on CPU.

For each selected model this measures one training step at a fixed batch size:
train mode, forward, cross-entropy against random labels, backward (no optimizer
step). One warm-up step is run first, then ``--repeats`` timed steps; the median
is reported.

Every model runs in a fresh subprocess (this same file with a hidden ``--worker``
flag) so that the process peak memory belongs to that model alone. Memory is the
process max RSS (``getrusage``); the reported "delta" is max RSS after the timed
steps minus max RSS right after building the model and the input batch, i.e. the
extra memory the training step itself needs (activations, gradients, workspace).

``--allocator kept`` (the default) keeps freed memory in the process for reuse, as ``python -m training`` does
since 2026-11-27 (:mod:`models.cpu.allocator`); ``--allocator glibc`` measures glibc's default, which every figure
before that date used.

``p4cnn`` is always measured as well, and every row shows its time and delta
memory relative to p4cnn's from the same run, which is the figure to compare
across machines. Beside it are the figures measured with the authors' code on
the same kind of machine (CPU, 2 threads, batch 64), where known.

Each model is measured twice, alternating: the default path (the compiled kernels
where :mod:`models.cpu.native_build` uses them on this CPU) and PyTorch's own path
(``AAGC_NATIVE=0``); ``x torch`` is the default's time over PyTorch's, which must not
exceed 1 (``--paths default`` skips the second). The header names the CPU's
instruction set as PyTorch dispatches it and as the kernels are built: a speed-up on
one CPU can be a slow-down on another. ``ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2 AAGC_NATIVE_MARCH=x86-64-v3`` measures AVX2 code on an
AVX-512 machine (all three: PyTorch's kernels, oneDNN's and ours).

On a shared host whose speed drifts by the minute (a KVM guest beside busy neighbours), the models measured
one after another see different machines: a_p4cnn's ratio to p4cnn read 3.5x and 5.4x an hour apart on one
such host. ``--rounds 3`` measures every model three times over, in turn, and keeps each model's fastest round
(the note lists every round), so that the ratios compare the models at the host's best.

Run from the repository root::

    python -m benchmarks.train_step
    python benchmarks/train_step.py --models all --json out/train_step.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

# Run as a script, the repo root is not on sys.path; the workers are always run as a script.
if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DEFAULT_MODELS = ["z2cnn", "p4cnn", "fa_p4cnn", "arh_p4cnn", "ach_p4cnn", "asp_p4cnn", "a_p4cnn"]
REFERENCE = "p4cnn"

# Authors' code, CPU, 2 threads, batch 64: (fwd+bwd seconds, peak memory MiB).
PAPER_FIGURES = {
    "z2cnn": (0.045, 66),
    "p4cnn": (0.11, 125),
    "fa_p4cnn": (0.2, 172),
    "a_p4cnn": (3.5, 1812),
    "arh_p4cnn": (0.124, 145),
}


def max_rss_mib() -> float:
    """Peak resident set size of this process so far, in MiB."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


def input_channels(dataset: str) -> int:
    return 1 if dataset == "rot_mnist" else 3


def training_step(model, x, labels=None):
    """Forward, cross-entropy, backward; returns the labels used (drawn on first call) and the class count."""
    import torch
    import torch.nn.functional as F

    logits = model(x)
    if labels is None:
        # The number of classes is only known from the logits; drawing the labels here
        # avoids an extra forward before the memory baseline is taken.
        labels = torch.randint(0, logits.shape[1], (x.shape[0],))
    F.cross_entropy(logits, labels).backward()
    return labels, logits.shape[1]


def measure(name: str, batch: int, threads: int, repeats: int, allocator: str = "kept") -> dict:
    """Build ``name`` and time its training step; meant to run alone in a fresh process."""
    import torch

    import models

    if allocator == "kept":
        keep_freed_memory()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    info = models.model_info(name)
    model = models.build_model(name).train()
    x = torch.randn(batch, input_channels(info.dataset), info.input_size, info.input_size)
    base = max_rss_mib()

    labels, classes = training_step(model, x)  # warm-up: allocator pools, lazy initialisations
    times = []
    for _ in range(repeats):
        # Free the gradients first so that every timed step allocates them, as after optimizer.zero_grad().
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        training_step(model, x, labels)
        times.append(time.perf_counter() - start)
    peak = max_rss_mib()

    return {
        "model": name,
        "dataset": info.dataset,
        "input_shape": list(x.shape),
        "classes": classes,
        "params": sum(p.numel() for p in model.parameters()),
        "seconds": statistics.median(times),
        "times": times,
        "rss_base_mib": base,
        "rss_peak_mib": peak,
        "delta_mib": peak - base,
    }


def keep_freed_memory() -> None:
    """Keep freed memory for reuse in this worker, as training does, or stop: a benchmark must not silently
    measure glibc's default instead."""
    from models.cpu.allocator import retain_freed_memory

    if not retain_freed_memory():
        raise RuntimeError("freed memory cannot be kept here (not glibc, or AAGC_KEEP_FREED_MEMORY=0): "
                           "measure glibc's default allocator instead")


def run_worker(name: str, args: argparse.Namespace, path: str = "default") -> dict:
    """Measure ``name`` in a fresh interpreter on ``path`` (``default``, or ``pytorch``: ``AAGC_NATIVE=0``); a
    failure becomes an ``error`` entry, not an exception."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        name,
        "--batch",
        str(args.batch),
        "--threads",
        str(args.threads),
        "--repeats",
        str(args.repeats),
        "--allocator",
        args.allocator,
    ]
    try:
        env = {**os.environ, **({"AAGC_NATIVE": "0"} if path == "pytorch" else {})}
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"model": name, "error": f"timed out after {args.timeout} s"}
    if proc.returncode != 0:
        return {"model": name, "error": describe_failure(proc)}
    try:
        # The result is the last line; anything the model printed before it is ignored.
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"model": name, "error": f"unreadable worker output: {proc.stdout[-200:]!r}"}


def measure_round(names: list[str], args: argparse.Namespace, label: str = "") -> list[dict]:
    """Every model once, each in its own process: the default path, then PyTorch's (with ``--paths both``)."""
    results = []
    for name in names:
        print(f"  {label}measuring {name} ...", file=sys.stderr, flush=True)
        result = run_worker(name, args)
        if args.paths == "both" and "error" not in result:
            pytorch = run_worker(name, args, "pytorch")
            if "error" in pytorch:
                result["pytorch_error"] = pytorch["error"]
            else:
                result["pytorch_seconds"], result["pytorch_times"] = pytorch["seconds"], pytorch["times"]
        results.append(result)
    return results


def fastest_rounds(rounds: list[list[dict]]) -> list[dict]:
    """Per model, the round whose default path was fastest, and the fastest round of PyTorch's path; with every
    round's time in ``round_seconds`` (and ``pytorch_round_seconds``). A model that failed in any round fails."""
    merged = []
    for results in zip(*rounds, strict=True):
        failed = next((r for r in results if "error" in r), None)
        if failed is not None:
            merged.append(failed)
            continue
        best = dict(min(results, key=lambda r: r["seconds"]))
        best["round_seconds"] = [r["seconds"] for r in results]
        paths = [r for r in results if "pytorch_seconds" in r]
        for key in ("pytorch_seconds", "pytorch_times", "pytorch_error"):
            best.pop(key, None)
        if len(paths) == len(results):
            fastest = min(paths, key=lambda r: r["pytorch_seconds"])
            best["pytorch_seconds"], best["pytorch_times"] = fastest["pytorch_seconds"], fastest["pytorch_times"]
            best["pytorch_round_seconds"] = [r["pytorch_seconds"] for r in results]
        elif any("pytorch_error" in r for r in results):
            best["pytorch_error"] = next(r["pytorch_error"] for r in results if "pytorch_error" in r)
        merged.append(best)
    return merged


def describe_failure(proc: subprocess.CompletedProcess) -> str:
    if proc.returncode < 0:
        sig = signal.Signals(-proc.returncode).name
        # The kernel's OOM killer sends SIGKILL, which leaves no traceback behind.
        hint = " (likely out of memory)" if sig == "SIGKILL" else ""
        return f"killed by {sig}{hint}"
    lines = proc.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit status {proc.returncode}"


def select_models(requested: list[str]) -> list[str]:
    """The models to run, in order, without duplicates, with the reference always included."""
    import models

    names = models.list_models() if requested == ["all"] else requested
    names = list(dict.fromkeys(names))
    if REFERENCE not in names:
        names.append(REFERENCE)
    return names


def add_ratios(results: list[dict]) -> None:
    """Time and delta memory relative to the reference model measured in the same run."""
    ref = next((r for r in results if r["model"] == REFERENCE and "error" not in r), None)
    for r in results:
        if ref is None or "error" in r:
            continue
        r["time_ratio"] = r["seconds"] / ref["seconds"]
        if "pytorch_seconds" in r:
            r["pytorch_ratio"] = r["seconds"] / r["pytorch_seconds"]
        # A tiny model can show no RSS growth at all, so guard the division.
        r["mem_ratio"] = r["delta_mib"] / ref["delta_mib"] if ref["delta_mib"] > 0 else None


def instruction_sets() -> str:
    """The CPU's vector instruction set as PyTorch dispatches it and as the kernels are built, with the settings
    that change either (set to measure a narrower CPU's code on this one)."""
    import torch

    from models.cpu.native_build import instruction_set

    keys = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "AAGC_NATIVE_MARCH", "AAGC_NATIVE")
    settings = [f"{key}={os.environ[key]}" for key in keys if key in os.environ]
    return (f"instruction set: PyTorch {torch.backends.cpu.get_cpu_capability()}, kernels {instruction_set()}"
            + (f" ({', '.join(settings)})" if settings else ""))


def header(args: argparse.Namespace) -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    return (
        f"machine: {cpu}, {os.cpu_count()} CPUs ({platform.system()}) | {instruction_sets()} | "
        f"torch {torch.__version__} | "
        f"threads {args.threads} | batch {args.batch} | allocator {args.allocator} | "
        f"median of {args.repeats} after 1 warm-up"
        + (f", fastest of {args.rounds} rounds" if args.rounds > 1 else "") + " | "
        # Other processes competing for the cores make the timings unreliable; show how busy the machine was.
        f"load avg {os.getloadavg()[0]:.1f}"
    )


def note(result: dict, spread: float = 1.5) -> str:
    """Why a row is missing or should not be trusted, and how far its rounds spread."""
    if "error" in result:
        return "FAILED: " + shorten(result["error"])
    notes = []
    fastest, slowest = min(result["times"]), max(result["times"])
    if slowest > spread * fastest:
        notes.append(f"noisy: steps took {fastest:.3g}-{slowest:.3g} s")
    if len(result.get("round_seconds", [])) > 1:
        notes.append("rounds " + "/".join(f"{s:.3f}" for s in result["round_seconds"]) + " s")
    return "; ".join(notes)


def shorten(text: str, width: int = 100) -> str:
    """Keep failure notes to one line; the full message is in the --json output."""
    return text if len(text) <= width else text[: width - 3] + "..."


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


COLUMNS = "{:<12} {:>9} {:>10} {:>7} {:>10} {:>7} {:>9} {:>8} {:>9} {:>10}  {}"


def table(results: list[dict]) -> list[str]:
    lines = [
        COLUMNS.format("model", "params", "fwd+bwd s", "x p4", "delta MiB", "x p4", "torch s", "x torch", "paper s",
                       "paper MiB", "note"),
        COLUMNS.format("-" * 12, "-" * 9, "-" * 10, "-" * 7, "-" * 10, "-" * 7, "-" * 9, "-" * 8, "-" * 9, "-" * 10,
                       "----"),
    ]
    for r in results:
        paper_s, paper_mib = PAPER_FIGURES.get(r["model"], (None, None))
        lines.append(
            COLUMNS.format(
                r["model"],
                fmt(r.get("params"), ","),
                fmt(r.get("seconds"), ".3f"),
                fmt(r.get("time_ratio"), ".2f"),
                fmt(r.get("delta_mib"), ".0f"),
                fmt(r.get("mem_ratio"), ".2f"),
                fmt(r.get("pytorch_seconds"), ".3f"),
                fmt(r.get("pytorch_ratio"), ".2f"),
                fmt(paper_s, "g"),
                fmt(paper_mib, "d"),
                note(r),
            )
        )
    return lines


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models",
        nargs="+",
        default=DEFAULT_MODELS,
        help="registry names, or 'all' (default: the rot-MNIST set); p4cnn is always added",
    )
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads in each worker")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per model; the median is reported")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed per model")
    parser.add_argument("--allocator", choices=["kept", "glibc"], default="kept",
                        help="kept: freed memory reused, as training runs (default); glibc: glibc's default")
    parser.add_argument("--paths", choices=["both", "default"], default="both",
                        help="both: the default path and PyTorch's (AAGC_NATIVE=0), alternating (default)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure every model this many times over, in turn; each keeps its fastest round "
                             "(a host whose speed drifts then compares the models at its best)")
    parser.add_argument("--json", metavar="PATH", help="also write the raw results here")
    parser.add_argument("--worker", metavar="NAME", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(measure(args.worker, args.batch, args.threads, args.repeats, args.allocator)))
        return

    head = header(args)
    print(head)
    names = select_models(args.models)
    rounds = [measure_round(names, args, f"round {i + 1}/{args.rounds}, " if args.rounds > 1 else "")
              for i in range(args.rounds)]
    results = fastest_rounds(rounds)
    add_ratios(results)
    print("\n".join(table(results)))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"header": head, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
