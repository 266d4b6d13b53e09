"""A slide through a model, a chunk of cells per task on Dask distributed, each finished chunk into the slide's
store as it arrives: what ``python -m app.slides`` runs.

Scheduling is Dask's (``dask.distributed``), not a home-made pool: by default a ``LocalCluster`` of worker
processes that the command starts and stops itself, or an existing scheduler named by ``--scheduler ADDRESS`` or
``$AAGC_DASK_SCHEDULER``. A task is one chunk (:func:`app.slides.engine.evaluate_chunk`); it names the slide and
the checkpoint by path and each worker process loads them once, so a task sends a few hundred bytes and returns
its chunk's arrays. Only chunks that hold tissue on the slide's tissue mask (:mod:`app.slides.tissue`) are
submitted, and only those the store does not hold already (:mod:`app.slides.store`): a stopped run resumes.

A run may be of the slide moved by an element of p4m (``element``, 1..7: quarter turns and mirrors,
:mod:`app.slides.moved`), analysed as a slide of its own in its own store, to prove that its heatmap is the
original's moved (:mod:`app.slides.proof`); element 0, the slide as scanned, is every run's default.

A run may be of the slide's pixels stain-normalised (``stain``: ``"macenko"`` or ``"reinhard"``,
:mod:`app.slides.stain`), from the slide's own estimate to the reference stain of the model's card, in a store of its
own (:func:`app.slides.store.store_key` names the normalisation); ``"none"``, the pixels as scanned, is the default.

A run is in one precision (:mod:`app.slides.precision`): float32, the exact path, or bfloat16 where the CPUs compute
it natively; the plan records the one decided, its store is named by it and each task carries it, so that results of
two precisions never meet in one store.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models import load_checkpoint
from models.precision import DTYPES, Precision

from ..analysis.pathology import model_microns_per_pixel
from ..analysis.transforms import apply_element
from .engine import ATTENTION_POOL, ChunkResult, SlideGrid, class_count, evaluate_chunk, slide_grid
from .moved import moved_slide
from .precision import FLOAT32, resolve_precision
from .reader import SlideError, open_slide
from .scale import Scale, slide_scale
from .stain import STAIN_SIDE, SlideStain, check_method, stain_of
from .store import ChunkStore, file_sha256, store_key
from .tissue import tissue_mask
from .workers import prepare_device, worker_device

__all__ = ["SlidePlan", "plan_slide", "start_slide", "chunk_key", "submit_chunk", "assemble", "local_client",
           "close_client", "worker_environ", "chunk_task", "tissue_share", "tissue_shares", "timed_chunk_task",
           "SCHEDULER_ENV", "THUMBNAIL_SIDE"]

SCHEDULER_ENV = "AAGC_DASK_SCHEDULER"
# The tissue mask's thumbnail: 16 um/px for a 1.6 cm slide, an 8-cell chunk still 15 pixels or more across; the
# mask of the CMU slide in 0.4 s (2,048 pixels: 1.6 s). The slide's stain is estimated from the same thumbnail
# (app.slides.stain), which a plan hands it rather than read it twice.
THUMBNAIL_SIDE = STAIN_SIDE  # 1024


@dataclass(frozen=True)
class SlidePlan:
    """What a slide's run needs: where it is, its scale and grid, its tissue, the chunks to evaluate; ``element``
    the element of p4m the slide is moved by (0: as scanned), which the grid, thumbnail, tissue and chunks are
    of; ``stain`` how its pixels are normalised before the model sees them (None: as scanned); ``precision`` the
    precision its chunks run in and why (:func:`app.slides.precision.resolve_precision`)."""

    slide: Path
    checkpoint: Path
    scale: Scale
    card: dict
    grid: SlideGrid
    thumbnail: np.ndarray
    tissue: np.ndarray
    chunks: tuple[tuple[int, int], ...]  # those with tissue, the least tissue first
    store: ChunkStore
    element: int = 0
    stain: SlideStain | None = None
    precision: Precision = FLOAT32

    @property
    def stain_method(self) -> str:
        """The normalisation's name (:data:`app.slides.stain.METHODS`): ``"none"`` for the pixels as scanned."""
        return self.stain.method if self.stain is not None else "none"


def plan_slide(slide_path: Path, checkpoint: Path, store_root: Path, user_mpp: float | None = None,
               chunk: int | None = None, element: int = 0, stain: str = "none",
               precision: str | Precision = "auto") -> SlidePlan:
    """Open ``slide_path``, moved by ``element`` (:func:`app.slides.moved.moved_slide`), find its scale, grid and
    tissue, and the chunks with tissue; with ``stain`` other than ``"none"``, the slide's stain estimate
    (:func:`app.slides.stain.slide_stain`, of the slide as scanned: a moved slide's pixels are normalised alike).
    ``precision``: a request of :data:`models.precision.PRECISIONS`, decided here by this machine's CPU (what a local
    cluster's workers share), or a :class:`models.precision.Precision` decided already for this checkpoint's model by
    a cluster's workers (:func:`app.slides.precision.resolve_precision`).

    The tissue of a moved slide is the original's mask moved: the mask's smoothing squares of an even side are
    half a pixel off centre, so a mask computed on the moved thumbnail can differ from the moved mask at its
    edges (measured on the TCGA slide at the scales it might have: up to 1.7 % of its tissue's pixels), which
    would change which chunks are evaluated for a reason that is no part of the model.

    Raises:
        SlideError: the slide cannot be read, has no scale (give ``user_mpp``), or has no tissue.
        StainError: an unknown ``stain``, or too little tissue to estimate the slide's stain.
        ValueError: an unknown ``precision``.
    """
    check_method(stain)
    model, card = load_checkpoint(checkpoint)
    chosen = precision if isinstance(precision, Precision) else resolve_precision(precision, model)
    del model  # the workers load their own; the card names the weights and the grid's context
    with open_slide(slide_path) as original:
        slide = moved_slide(original, element)
        scale = slide_scale(slide.properties, user_mpp)
        if scale.microns_per_pixel is None:
            raise SlideError(f"{Path(slide_path).name}: {scale.sentence}")
        if not slide.colour:
            raise SlideError(f"{Path(slide_path).name} is an image of grey levels: an H&E model judges colour, "
                             "stained tissue")
        grid = slide_grid(slide, scale.microns_per_pixel, card, model_microns_per_pixel(card),
                          **({"chunk": chunk} if chunk else {}))
        thumbnail = original.thumbnail(THUMBNAIL_SIDE)
        identity = slide_identity(original, slide_path)
    normalised = stain_of(stain, slide_path, card, thumbnail)  # the slide as scanned: its thumbnail, not moved
    thumbnail_mpp = scale.microns_per_pixel * original.dimensions[0] / thumbnail.shape[1]
    tissue, _ = tissue_mask(thumbnail, thumbnail_mpp)
    if element:  # the original's thumbnail and mask moved (the moved slide's thumbnail is exactly that one)
        thumbnail = np.ascontiguousarray(apply_element(thumbnail.transpose(2, 0, 1), element).transpose(1, 2, 0))
        tissue = apply_element(tissue, element)
    # Shortest first: the chunks with the least tissue (the fewest cells to evaluate) are submitted first, so
    # that the first cells are drawn within seconds while the large chunks run (a scheduler runs them in order).
    shares = tissue_shares(grid, tissue)
    chunks = tuple(sorted((index for index, share in shares.items() if share > 0), key=shares.__getitem__))
    if not chunks:
        raise SlideError(f"{Path(slide_path).name}: no tissue found (its tissue mask is empty): nothing to analyse")
    weights = str(card.get("weights_sha256") or file_sha256(checkpoint))  # the tensors, whatever the metadata
    store = ChunkStore(store_root, store_key(identity, weights, grid, element=element, stain=normalised,
                                             precision=chosen.name))
    return SlidePlan(Path(slide_path), Path(checkpoint), scale, card, grid, thumbnail, tissue, chunks, store,
                     element, normalised, chosen)


def slide_identity(slide, path: Path) -> str:
    """What names a slide's pixels for its store: OpenSlide's ``quickhash-1`` (a sha256 of the slide's smallest
    level and its properties, made for this) and the file's size; an image's sha256. Hashing a whole slide of
    gigabytes would cost seconds on every visit."""
    quick = slide.properties.get("openslide.quickhash-1")
    return f"{quick}:{Path(path).stat().st_size}" if quick else file_sha256(path)


def tissue_share(grid: SlideGrid, tissue: np.ndarray, ci: int, cj: int) -> float:
    """The share of chunk (ci, cj)'s contexts that the tissue mask (a thumbnail of the slide) covers: 0 for a chunk
    of glass, never evaluated."""
    r0, r1, c0, c1 = _mask_block(grid, tissue.shape, ci, cj)
    return float(tissue[r0:r1, c0:c1].mean())


def tissue_shares(grid: SlideGrid, tissue: np.ndarray) -> dict[tuple[int, int], float]:
    """:func:`tissue_share` of every chunk, the same numbers (a count of the mask's pixels over the block's), from
    one summed-area table of the mask: 10,201 block means took 0.25 s of the gigapixel slide's plan."""
    summed = np.zeros((tissue.shape[0] + 1, tissue.shape[1] + 1), dtype=np.int64)
    summed[1:, 1:] = np.asarray(tissue, dtype=np.int64).cumsum(axis=0).cumsum(axis=1)
    shares = {}
    for index in np.ndindex(*grid.chunks):
        r0, r1, c0, c1 = _mask_block(grid, tissue.shape, *index)
        count = summed[r1, c1] - summed[r0, c1] - summed[r1, c0] + summed[r0, c0]
        shares[index] = float(count / ((r1 - r0) * (c1 - c0))) if r1 > r0 and c1 > c0 else float("nan")
    return shares


def _mask_block(grid: SlideGrid, shape: tuple[int, ...], ci: int, cj: int) -> tuple[int, int, int, int]:
    """Rows and columns ``(r0, r1, c0, c1)`` of a mask of ``shape`` over the whole slide that chunk (ci, cj)'s
    contexts cover, rounded outwards."""
    top, bottom, left, right = grid.context_block(ci, cj)
    rows_per_model, cols_per_model = shape[0] / grid.model_size[0], shape[1] / grid.model_size[1]
    return (math.floor(top * rows_per_model), math.ceil(bottom * rows_per_model),
            math.floor(left * cols_per_model), math.ceil(right * cols_per_model))


@functools.lru_cache(maxsize=2)
def _worker_model(checkpoint: str, mtime_ns: int):
    """The model and card, loaded once per worker process (and again only when the file changes), the model on the
    worker's device: its GPU where it sees one (:mod:`app.slides.workers`)."""
    del mtime_ns
    model, card = load_checkpoint(checkpoint)
    device = worker_device()
    prepare_device(device)
    return model.to(device), card


def chunk_task(slide_path: str, microns_per_pixel: float, checkpoint: str, chunk: int, ci: int,
               cj: int, element: int = 0, stain: dict | None = None, precision: str = "float32") -> ChunkResult:
    """One chunk, on a worker: the slide opened (moved by ``element``), the model from the worker's cache, the
    grid made again (it is a function of the slide, the scale and the card); ``stain`` the plan's normalisation
    (:meth:`app.slides.stain.SlideStain.to_dict`: the slide's estimate sent, not made again on each worker);
    ``precision`` the plan's, run as it says whatever this worker's CPU would have chosen (emulated bfloat16 is
    slow, but a store holds one precision)."""
    dtype = DTYPES[precision]  # a bfloat16 input runs the network's bfloat16 path
    model, card = _worker_model(checkpoint, os.stat(checkpoint).st_mtime_ns)
    normalised = SlideStain.from_dict(stain) if stain else None
    with moved_slide(open_slide(slide_path), element) as slide:
        grid = slide_grid(slide, microns_per_pixel, card, model_microns_per_pixel(card), chunk=chunk)
        return evaluate_chunk(model, card, slide, grid, ci, cj, stain=normalised, dtype=dtype)


def timed_chunk_task(slide_path: str, microns_per_pixel: float, checkpoint: str, chunk: int, ci: int,
                     cj: int, element: int = 0, stain: dict | None = None,
                     precision: str = "float32") -> tuple[ChunkResult, float]:
    """:func:`chunk_task` and the worker's seconds on it: what every run submits (:func:`submit_chunk`)."""
    start = time.perf_counter()
    # As submit_chunk: a normalisation and a precision other than float32 only where there are.
    options = {"stain": stain} if stain else {}
    options.update({"precision": precision} if precision != "float32" else {})
    result = chunk_task(slide_path, microns_per_pixel, checkpoint, chunk, ci, cj, element, **options)
    return result, time.perf_counter() - start


def chunk_key(plan: SlidePlan, ci: int, cj: int) -> str:
    """The Dask key of chunk (ci, cj) of ``plan``: its store's and the chunk's, so that every run of one store on one
    cluster (the app's pages, a cohort's command) shares the task; a moved slide's store, a normalised one and one of
    another precision, and so their keys, are their own (:func:`app.slides.store.store_key`)."""
    return f"chunk-{plan.store.folder.name}-{ci}-{cj}"


def submit_chunk(client, plan: SlidePlan, ci: int, cj: int):
    """Chunk (ci, cj) of ``plan`` as one task on ``client`` (:func:`chunk_key`), its future giving ``(ChunkResult,
    worker seconds)``."""
    # The normalisation and the precision as keywords, only where there is one and it is not float32: a task of the
    # pixels as scanned in float32 is as before.
    options = {"stain": plan.stain.to_dict()} if plan.stain is not None else {}
    options.update({"precision": plan.precision.name} if plan.precision.name != "float32" else {})
    return client.submit(timed_chunk_task, str(plan.slide), plan.scale.microns_per_pixel, str(plan.checkpoint),
                         plan.grid.chunk, ci, cj, plan.element, key=chunk_key(plan, ci, cj), **options)


def start_slide(plan: SlidePlan, client, failed: Callable[[BaseException], None] | None = None) -> list:
    """Submit ``plan``'s chunks that its store lacks to ``client`` and return their futures at once: each chunk
    goes into the store as it finishes (in the client's thread), so that a page can show them while the rest run,
    and leaving the page loses nothing finished. ``failed`` is told of a chunk that raised."""
    missing = [index for index in plan.chunks if plan.store.get(*index) is None]

    def finished(future) -> None:
        if future.status == "finished":
            plan.store.put(future.result()[0])
        elif failed is not None and future.status == "error":
            failed(future.exception())

    futures = [submit_chunk(client, plan, ci, cj) for ci, cj in missing]
    for future in futures:
        future.add_done_callback(finished)
    return futures


def local_client(workers: int = 1, threads: int = 2, **options):
    """A ``dask.distributed`` client on a ``LocalCluster`` of ``workers`` processes of ``threads`` threads each,
    on this machine only (127.0.0.1), without a dashboard; ``options`` go to the ``LocalCluster`` (the command line
    gives ``silence_logs``: its workers' logs are its own stderr).

    The cluster speaks TLS with credentials made for it (``security=True``: a self-signed certificate held in this
    process's memory and handed to its nanny and workers), and its scheduler and workers accept only peers that
    present them: another process on the machine cannot connect, let alone run code in the workers (plain tcp
    would let it: Dask calls it "unauthenticated and unencrypted")."""
    import dask
    from dask.distributed import Client, LocalCluster

    # The scheduler serves its HTTP routes (health, metrics) even without a dashboard, on the dashboard's address or
    # else 8787: a second cluster on the machine (another server, a test) found 8787 taken and warned in the logs.
    # A free port of 127.0.0.1 instead, and no dashboard.
    http = {"dashboard": False, "dashboard_address": "127.0.0.1:0", **options.pop("scheduler_kwargs", {})}
    with dask.config.set({"distributed.nanny.pre-spawn-environ": worker_environ()}):
        cluster = LocalCluster(n_workers=workers, threads_per_worker=threads, processes=True, host="127.0.0.1",
                               dashboard_address=None, security=True, scheduler_kwargs=http, **options)
    return Client(cluster)  # with the cluster's security


def worker_environ() -> dict:
    """The environment a local cluster's worker processes start with: Dask's own (``distributed.nanny.pre-spawn-
    environ``: one PyTorch thread per task, ...) and freed memory kept for the next batch in one malloc arena
    (:func:`models.cpu.allocator.freed_memory_environ`). Dask's own setting for glibc hands every block above 128 KiB
    back to the system when freed: each batch faulted its activations in afresh, 40 % of a worker's CPU time. glibc
    reads these when the process starts, so they are set before Dask spawns it."""
    import dask
    import distributed  # noqa: F401  (its import loads the nanny's settings into dask.config)

    from models.cpu.allocator import freed_memory_environ

    return {**dask.config.get("distributed.nanny.pre-spawn-environ"), **freed_memory_environ()}


def close_client(client) -> None:
    """Close ``client``, and its cluster where it started one (a local cluster; an existing scheduler's stays)."""
    cluster = client.cluster
    client.close()
    if cluster is not None:
        cluster.close()


def assemble(plan: SlidePlan, results: dict[tuple[int, int], ChunkResult]) -> dict:
    """The slide's per-cell arrays from its chunks: ``probabilities`` (rows, cols, classes; NaN where not
    evaluated), ``evaluated``, ``tissue`` (cells in chunks without tissue: 0), and ``attention``: per reading of
    the first attentive layer, its map over the cells (``(rows * 32 / pool, cols * 32 / pool)`` float32, NaN
    where no cell was evaluated; :data:`app.slides.engine.ATTENTION_POOL`)."""
    rows, cols = plan.grid.cells.rows, plan.grid.cells.cols
    classes = class_count(plan.card)
    side = plan.grid.cells.cell // ATTENTION_POOL  # map pixels per cell side
    probabilities = np.full((rows, cols, classes), np.nan)
    evaluated = np.zeros((rows, cols), dtype=bool)
    tissue = np.zeros((rows, cols))
    attention: dict[str, np.ndarray] = {}
    for (ci, cj), result in results.items():
        i0, i1, j0, j1 = plan.grid.cell_block(ci, cj)
        probabilities[i0:i1, j0:j1] = result.probabilities
        evaluated[i0:i1, j0:j1] = result.evaluated
        tissue[i0:i1, j0:j1] = result.tissue
        for reading, maps in result.attention.items():
            if reading not in attention:
                attention[reading] = np.full((rows * side, cols * side), np.nan, dtype=np.float32)
            attention[reading][i0 * side:i1 * side, j0 * side:j1 * side] = maps
    return dict(probabilities=probabilities, evaluated=evaluated, tissue=tissue, attention=attention)
