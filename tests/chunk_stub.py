"""What the scheduling tests share (tests/test_slides_schedule.py, tests/test_app_slide_sessions.py): the engine's
stand-in on a real in-process Dask cluster, and views over chosen chunks of a plan.

The stand-in replaces :func:`app.slides.run.chunk_task` (the cluster's workers are threads of this process, so the
test's monkeypatch reaches them): it records each chunk as it starts and as it ends, and holds each one until the
test lets it through, one permit per chunk (:meth:`ChunkStub.allow`) or all at once (:meth:`ChunkStub.open`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from app.slides.engine import ChunkResult

__all__ = ["ChunkStub", "empty_chunk", "in_process_client", "view_of", "inner_chunks", "WAIT_S"]

WAIT_S = 60  # the longest a held chunk waits for the test, and a test for what it waits for


def empty_chunk(grid, ci: int, cj: int) -> ChunkResult:
    """Chunk (ci, cj) of ``grid`` with nothing evaluated."""
    i0, i1, j0, j1 = grid.cell_block(ci, cj)
    shape = (i1 - i0, j1 - j0)
    return ChunkResult((ci, cj), np.zeros(shape), np.zeros(shape, dtype=bool), np.full((*shape, 2), np.nan), {})


class ChunkStub:
    """The engine's stand-in: ``result(slide_path, ci, cj)`` is what each chunk returns (by default an empty chunk of
    ``grid``), or it raises for the chunks in ``failing``. ``started`` and ``ended`` list ``(slide file name, chunk)``
    in the order the workers took them up and let them go."""

    def __init__(self, grid=None, result: Callable[[str, int, int], ChunkResult] | None = None):
        self.result = result or (lambda slide_path, ci, cj: empty_chunk(grid, ci, cj))
        self.started: list[tuple[str, tuple[int, int]]] = []
        self.ended: list[tuple[str, tuple[int, int]]] = []
        self.failing: set[tuple[int, int]] = set()
        self.lock = threading.Lock()
        self._permits = threading.Semaphore(0)
        self._open = threading.Event()

    def allow(self, count: int) -> None:
        """Let ``count`` more chunks through (those held now first, then those to come)."""
        for _ in range(count):
            self._permits.release()

    def open(self) -> None:
        """Let every chunk through, now and from now on."""
        self._open.set()
        self.allow(10_000)

    def __call__(self, slide_path, microns_per_pixel, checkpoint, chunk, ci, cj, element=0, precision="float32"):
        name = Path(slide_path).name
        with self.lock:
            self.started.append((name, (ci, cj)))
        if not self._open.is_set():
            assert self._permits.acquire(timeout=WAIT_S), "the test never let this chunk through"
        try:
            if (ci, cj) in self.failing:
                raise RuntimeError("the stub was told to fail")
            return self.result(str(slide_path), ci, cj)
        finally:
            with self.lock:
                self.ended.append((name, (ci, cj)))

    def of(self, name: str) -> list[tuple[int, int]]:
        """The chunks of the slide file ``name`` started, in order."""
        with self.lock:
            return [index for slide, index in self.started if slide == name]


@contextmanager
def in_process_client():
    """A Dask client on a cluster of one worker of two threads in this process (no dashboard)."""
    from dask.distributed import Client

    with Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None) as client:
        yield client


def view_of(plan, ci: int, cj: int, radius: int = 1) -> tuple[tuple, set]:
    """A view over chunks (ci - radius .. ci + radius, cj - radius ..), kept 1 pixel inside them, in level-0 pixels
    from the cells' corners (left, top, width, height), and the chunks with tissue it meets."""
    corners, (cell_rows, cell_cols) = plan.grid.cell_top_left_px(), plan.grid.cell_size_px()
    (r0, _, c0, _), (_, r1, _, c1) = (plan.grid.cell_block(ci - radius, cj - radius),
                                      plan.grid.cell_block(ci + radius, cj + radius))
    top, left = corners[r0, c0] + 1
    bottom, right = corners[r1 - 1, c1 - 1] + (cell_rows - 1, cell_cols - 1)
    inside = {(i, j) for i in range(ci - radius, ci + radius + 1) for j in range(cj - radius, cj + radius + 1)}
    return (left, top, right - left, bottom - top), inside & set(plan.chunks)


def inner_chunks(plan) -> list[tuple[int, int]]:
    """The chunks with tissue whose eight neighbours have tissue too, top left first."""
    chunks = set(plan.chunks)
    return sorted(index for index in chunks
                  if all((index[0] + di, index[1] + dj) in chunks for di in (-1, 0, 1) for dj in (-1, 0, 1)))
