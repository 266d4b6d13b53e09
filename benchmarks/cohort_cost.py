"""What a slide costs, and a cohort on paper: ``python -m benchmarks.slides --cohort`` (this module's :func:`main`).

Measured on this machine, with its CPU and instruction set named beside every figure:

- ``cells/s`` of the whole slide with 1 worker x 2 threads against 2 workers x 1 thread (a ``LocalCluster`` started
  before the clock, an empty store each time; a Dask worker runs PyTorch on one thread per task, its nanny sets
  ``OMP_NUM_THREADS=1``, so both have two tasks at once);
- the work per cell: the network's multiply-adds for one evaluated cell, counted by PyTorch's ``FlopCounterMode``
  over a real chunk of the slide on the plain PyTorch path (``AAGC_NATIVE=0``, ``AAGC_NNPACK=0``: direct
  convolutions, the model's nominal arithmetic; NNPACK's Winograd convolutions do fewer), in a child process;
- the machine's multiply-add rate: the best of float32 square matrix products (``torch.mm``, 2,048 a side) on
  one thread and on all; the engine's rate (cells/s x multiply-adds per cell) against it says how close it runs
  to the hardware's limit;
- the scheduler's cost per task: no-op tasks through a ``LocalCluster`` of 1, 2 and 4 worker processes of one
  thread, wall time over tasks;
- the bytes a chunk moves through Dask: the task (its function and arguments, pickled) and its result (the
  chunk's arrays, pickled as Dask sends them); the slide's pixels are read by the worker from the slide's file,
  not sent.

With ``--gpu`` instead (:func:`device_check`): the slide on a worker's GPU against the CPU, its cells/s, the whole
slide's seconds and the largest difference of the probabilities; where there is no GPU it says so and measures
nothing (``--device cpu`` runs the same path on the CPU).

From these, on paper (:func:`cohort_estimate`): Camelyon16's 399 slides on 8 CPU machines and on 4 GPUs, every
assumption printed with it. No GPU here: the GPU figure is an estimate from the project's own H200 training
throughput of the shipped model (docs/training.md), said so where it is printed.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from app.slides.run import chunk_task, close_client, plan_slide, timed_chunk_task, tissue_share

REPO = Path(__file__).resolve().parents[1]
CAMELYON16_SLIDES = 399
# The GPU estimate's source (docs/training.md, 2026-11-28): fa_p4m_densenet on one H200, four runs at once under
# MPS in bf16, an epoch of 7,456 training draws and 2,907 validation patches in 13-15 s each.
H200_TRAINING = dict(runs=4, draws=7456, validation=2907, epoch_s=14.0)
# A training step is about three forward passes' work (forward, and a backward of twice that).
STEP_FORWARDS = 3
# float32 inference against the bf16 training measured: assumed half the speed (no H200 here to measure it).
FLOAT32_PER_BF16 = 0.5


def macs_per_cell(slide: Path, checkpoint: Path, mpp: float | None, chunk: int | None) -> dict:
    """Multiply-adds per evaluated cell, counted over the slide's chunk with the most tissue on the plain PyTorch
    path, in a child process (the fast paths are chosen when first used, so the switches must be set before)."""
    code = ("import json, sys; from benchmarks.cohort_cost import _count_macs; "
            "print(json.dumps(_count_macs(*sys.argv[1:])))")
    env = dict(os.environ, AAGC_NATIVE="0", AAGC_NNPACK="0", PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code, str(slide), str(checkpoint), str(mpp or ""), str(chunk or "")],
                         cwd=REPO, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _fullest_chunk(plan) -> tuple[int, int]:
    """The chunk of ``plan`` that covers the most tissue on its mask (the share the plan orders its chunks by)."""
    return max(plan.chunks, key=lambda index: tissue_share(plan.grid, plan.tissue, *index))


def _count_macs(slide: str, checkpoint: str, mpp: str, chunk: str) -> dict:
    from torch.utils.flop_counter import FlopCounterMode

    with tempfile.TemporaryDirectory() as store:
        plan = plan_slide(Path(slide), Path(checkpoint), Path(store), float(mpp) if mpp else None,
                          int(chunk) if chunk else None)
    index = _fullest_chunk(plan)
    with FlopCounterMode(display=False) as counter:
        result = chunk_task(str(plan.slide), plan.scale.microns_per_pixel, str(plan.checkpoint), plan.grid.chunk,
                            *index)
    cells = int(result.evaluated.sum())
    return dict(macs_per_cell=counter.get_total_flops() / 2 / cells, cells_counted=cells)


def matmul_rate(threads: int, side: int = 2048, repeats: int = 5, dtype=None) -> float:
    """Multiply-adds per second of the best of ``repeats`` ``side``-square matrix products on ``threads`` threads, in
    ``dtype`` (default float32; bfloat16 runs oneDNN's AMX or AVX512-BF16 products where the CPU has them)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = (torch.rand(side, side, dtype=dtype or torch.float32) for _ in range(2))
        torch.mm(a, b)  # warm-up
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(before)
    return side**3 / best


def _noop(i: int) -> int:
    return i


def scheduler_cost(workers: int, tasks: int) -> float:
    """Seconds per task of ``tasks`` no-op tasks through a local cluster of ``workers`` one-thread processes (the
    cluster started and warmed before the clock)."""
    from dask.distributed import wait

    from app.slides.run import local_client

    client = local_client(workers, 1)
    try:
        wait(client.map(_noop, range(100), pure=False))
        start = time.perf_counter()
        wait(client.map(_noop, range(tasks), pure=False))
        return (time.perf_counter() - start) / tasks
    finally:
        close_client(client)


def chunk_bytes(slide: Path, checkpoint: Path, mpp: float | None, chunk: int | None) -> dict:
    """Bytes through Dask for the slide's fullest chunk: its task and its result, pickled (protocol 5, as Dask
    sends them), and how many of its cells were evaluated."""
    with tempfile.TemporaryDirectory() as store:
        plan = plan_slide(slide, checkpoint, Path(store), mpp, chunk)
    index = _fullest_chunk(plan)
    task = (timed_chunk_task, str(plan.slide), plan.scale.microns_per_pixel, str(plan.checkpoint), plan.grid.chunk,
            *index)
    result = chunk_task(*task[1:])
    return dict(task_bytes=len(pickle.dumps(task, protocol=5)),
                result_bytes=len(pickle.dumps((result, 1.0), protocol=5)),
                chunk_cells=int(np.prod(result.evaluated.shape)), chunk_evaluated=int(result.evaluated.sum()))


def cohort_estimate(cells_per_s_per_core: float, macs: float, task_s: float, result_bytes: int, *,
                    slides: int = CAMELYON16_SLIDES, tissue_mm2: float = 120.0, machines: int = 8,
                    cores: int = 32, gpus: int = 4, chunk_cells: int = 256, model_mpp: float = 0.972) -> dict:
    """Camelyon16 on paper: hours for ``slides`` slides of ``tissue_mm2`` of tissue each on ``machines`` CPU
    machines of ``cores`` cores (this machine's rate per core, scaled linearly) and on ``gpus`` H200s (estimated,
    :data:`H200_TRAINING`), with the scheduler's time and the bytes moved."""
    cell_mm2 = (32 * model_mpp / 1000) ** 2
    cells = slides * tissue_mm2 / cell_mm2
    tasks = cells / chunk_cells * 1.25  # chunks on the tissue's edge are partly glass: a quarter more, assumed
    run = H200_TRAINING
    gpu_cells_per_s = (run["runs"] * (run["draws"] * STEP_FORWARDS + run["validation"]) / run["epoch_s"]
                       * FLOAT32_PER_BF16)
    return dict(slides=slides, tissue_mm2=tissue_mm2, cells=cells, tasks=tasks, machines=machines, cores=cores,
                gpus=gpus, cpu_hours=cells / (cells_per_s_per_core * cores * machines) / 3600,
                gpu_cells_per_s=gpu_cells_per_s, gpu_hours=cells / (gpu_cells_per_s * gpus) / 3600,
                gpu_implied_tflops=gpu_cells_per_s * macs * 2 / 1e12,
                scheduler_hours=tasks * task_s / 3600, moved_gb=tasks * result_bytes / 1e9)


def measure(slide: Path, checkpoint: Path, mpp: float | None, chunk: int | None, tasks: int,
            worker_counts: tuple[int, ...], analysis_times) -> dict:
    """Every figure of the module's docstring, in one report; ``analysis_times`` is
    ``benchmarks.slides.analysis_times`` (handed in: that module is the entry that calls this one)."""
    report = dict(slide=slide.name)
    for workers, threads in ((1, 2), (2, 1)):
        times = analysis_times(slide, checkpoint, mpp, workers, threads, chunk)
        report[f"cells_per_s_{workers}x{threads}"] = times["cells_per_s"]
        report["cells"] = times["cells"]
    report.update(macs_per_cell(slide, checkpoint, mpp, chunk))
    report["matmul_macs_per_s_1_thread"] = matmul_rate(1)
    report["matmul_macs_per_s_all"] = matmul_rate(os.cpu_count() or 1)
    best = max(report["cells_per_s_1x2"], report["cells_per_s_2x1"])
    report["engine_macs_per_s"] = best * report["macs_per_cell"]
    report["share_of_limit"] = report["engine_macs_per_s"] / report["matmul_macs_per_s_all"]
    report["task_s"] = {workers: scheduler_cost(workers, tasks) for workers in worker_counts}
    report.update(chunk_bytes(slide, checkpoint, mpp, chunk))
    per_core = best / 2  # two tasks at once, one thread each
    report["estimate"] = cohort_estimate(per_core, report["macs_per_cell"], max(report["task_s"].values()),
                                         report["result_bytes"])
    return report


def device_check(slide: Path, checkpoint: Path, mpp: float | None, chunk: int | None, device=None) -> dict:
    """The slide evaluated whole on ``device`` (default: a worker's, :func:`app.slides.workers.worker_device`: its
    GPU where it sees one) and on the CPU, in this process, chunk by chunk: the largest difference of the tumour
    probabilities, and the device's cells/s and whole-slide seconds (after one chunk of warm-up)."""
    import torch

    from app.slides.engine import evaluate_chunk
    from app.slides.reader import open_slide
    from app.slides.workers import prepare_device, worker_device
    from models import load_checkpoint

    device = torch.device(device) if device is not None else worker_device()
    prepare_device(device)
    with tempfile.TemporaryDirectory() as store:
        plan = plan_slide(slide, checkpoint, Path(store), mpp, chunk)
    on_cpu, card = load_checkpoint(checkpoint)
    on_device = load_checkpoint(checkpoint)[0].to(device)
    with open_slide(slide) as opened:
        evaluate_chunk(on_device, card, opened, plan.grid, *plan.chunks[0])  # warm-up: kernels chosen, memory taken
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        results = [evaluate_chunk(on_device, card, opened, plan.grid, *index) for index in plan.chunks]
        seconds = time.perf_counter() - start  # each chunk's results are on the CPU when it returns: synchronised
        cells, largest = 0, 0.0
        for index, result in zip(plan.chunks, results, strict=True):
            reference = evaluate_chunk(on_cpu, card, opened, plan.grid, *index)
            shown = result.evaluated
            cells += int(shown.sum())
            if shown.any():
                difference = np.abs(result.probabilities[shown] - reference.probabilities[shown]).max()
                largest = max(largest, float(difference))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "the CPU"
    return dict(device=str(device), device_name=name, device_cells=cells, device_seconds=seconds,
                device_cells_per_s=cells / seconds, largest_difference=largest)


def print_report(report: dict, cpu: str) -> None:
    """The report as lines, the CPU and instruction set beside every measured figure."""
    print(f"{report['slide']}, {report['cells']:,} cells: {report['cells_per_s_1x2']:.1f} cells/s with 1 worker x "
          f"2 threads, {report['cells_per_s_2x1']:.1f} with 2 workers x 1 thread [{cpu}]")
    print(f"work per cell: {report['macs_per_cell'] / 1e9:.3f} G multiply-adds (direct convolutions, counted over "
          f"{report['cells_counted']} cells); the machine: {report['matmul_macs_per_s_1_thread'] / 1e9:.1f} G/s on "
          f"one thread, {report['matmul_macs_per_s_all'] / 1e9:.1f} G/s on all (float32 matrix products) [{cpu}]")
    print(f"the engine: {report['engine_macs_per_s'] / 1e9:.1f} G multiply-adds/s, "
          f"{100 * report['share_of_limit']:.0f} % of the machine's matrix-product rate [{cpu}]")
    costs = ", ".join(f"{workers} worker(s) {1000 * s:.2f} ms" for workers, s in report["task_s"].items())
    print(f"scheduler cost per task: {costs} [{cpu}]")
    chunk_s = report["chunk_evaluated"] / (max(report["cells_per_s_1x2"], report["cells_per_s_2x1"]) / 2)
    print(f"bytes per chunk: task {report['task_bytes']:,} B, result {report['result_bytes']:,} B "
          f"({report['chunk_evaluated']} of {report['chunk_cells']} cells evaluated, {chunk_s:.1f} s of one core: "
          f"scheduling {100 * max(report['task_s'].values()) / chunk_s:.3f} % of it) [{cpu}]")
    e = report["estimate"]
    print(f"on paper, Camelyon16 ({e['slides']} slides), assuming {e['tissue_mm2']:.0f} mm^2 of tissue a slide "
          f"({e['cells'] / e['slides']:,.0f} cells, {e['tasks'] / e['slides']:,.0f} chunks):")
    print(f"  {e['machines']} CPU machines of {e['cores']} cores, this machine's rate per core scaled linearly: "
          f"{e['cpu_hours']:.1f} h; the scheduler busy {e['scheduler_hours'] * 60:.1f} min of it; "
          f"{e['moved_gb']:.1f} GB of results moved")
    print(f"  {e['gpus']} H200s: {e['gpu_hours']:.1f} h at an ESTIMATED {e['gpu_cells_per_s']:,.0f} cells/s each "
          f"(not measured: from this model's H200 training throughput in bf16, docs/training.md, a step taken as "
          f"{STEP_FORWARDS} forward passes and float32 at half of bf16's speed; "
          f"{e['gpu_implied_tflops']:.1f} TFLOP/s of the H200's 67 of float32)")


def main(args, analysis_times) -> int:
    """The cohort report for ``args`` (``benchmarks.slides``' arguments, with ``tasks`` and ``worker_counts``);
    ``analysis_times``: see :func:`measure`."""
    from benchmarks.browser_latency import cpu_model
    from benchmarks.train_step import instruction_sets

    cpu = f"{cpu_model()} | {instruction_sets()}"
    if args.gpu:
        return _gpu_main(args, cpu)
    report = measure(args.slide, args.checkpoint, args.mpp, args.chunk, args.tasks, tuple(args.worker_counts),
                     analysis_times)
    report.update(cpu=cpu_model(), instruction_set=instruction_sets(), load_average=os.getloadavg()[0])
    print(f"CPU: {cpu} | load average {report['load_average']:.2f}")
    print_report(report, cpu)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _gpu_main(args, cpu: str) -> int:
    """``--gpu``: :func:`device_check` on a worker's device, where it is a GPU."""
    from app.slides.workers import worker_device

    if worker_device().type != "cuda" and args.device is None:
        print(f"no GPU here (PyTorch sees no CUDA device): nothing measured [{cpu}]")
        return 0
    report = device_check(args.slide, args.checkpoint, args.mpp, args.chunk, args.device)
    print(f"{args.slide.name} on {report['device_name']} ({report['device']}), float32 without TF32: "
          f"{report['device_cells']:,} cells in {report['device_seconds']:.1f} s, {report['device_cells_per_s']:,.0f} "
          f"cells/s; the tumour probabilities differ from the CPU's by at most {report['largest_difference']:.1e} "
          f"[the CPU: {cpu}]")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0
