"""The proof on a whole slide that the maps transform exactly with the image: the slide moved by an element g of
p4m (:mod:`app.slides.moved`) and analysed as a run of its own gives the original's per-cell maps moved by g.

Both runs' arrays are :func:`app.slides.run.assemble`'s. The grid is centred with even sides at the model's scale,
so g maps the moved slide's cells onto the original's; each cell is judged in its own context, so how either slide
was cut into chunks plays no part in its numbers (only in whether it is evaluated at all,
:attr:`MovedComparison.cells_in_one_only`). What is left is the network's equivariance, exact up to float32 round-off
(1e-5 relative, ``DESIGN.md``), and the attention's storage in float16 (:class:`app.slides.engine.ChunkResult`),
which rounds away differences below a float16 step of the value: those are the tolerances a page may state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..analysis.transforms import apply_element

__all__ = ["MovedComparison", "move_cells", "move_assembled", "compare_moved"]


@dataclass(frozen=True)
class MovedComparison:
    """The moved run against the original's arrays moved.

    Attributes:
        probability_difference: largest absolute difference of any class's probability over the cells evaluated
            in both (NaN where there are none).
        attention_difference: per reading of the attention kept in both, the largest absolute difference over the
            pixels both hold (NaN where there are none).
        tissue_difference: largest absolute difference of the tissue shares of the cells evaluated in both.
        cells_compared: cells evaluated in both.
        cells_in_one_only: cells evaluated in one run and not the other (0 when the evaluated sets are the same).
            Each run evaluates only the chunks of cells that its tissue mask finds tissue in; chunks are cut from
            the slide's top-left corner, so where g does not map one run's chunks onto the other's (a quarter turn
            of a grid whose sides are not multiples of the chunk), a cell with a little tissue may lie in a chunk
            with tissue in one run and in a chunk of glass, not evaluated, in the other.
    """

    probability_difference: float
    attention_difference: dict[str, float]
    tissue_difference: float
    cells_compared: int
    cells_in_one_only: int

    @property
    def evaluated_differ(self) -> bool:
        """Whether the two runs evaluated different cells (the moved set is not the original's moved)."""
        return self.cells_in_one_only > 0


def move_cells(array: np.ndarray, g: int) -> np.ndarray:
    """A per-cell (or per-pixel) array ``(rows, cols, ...)`` moved by g on its first two axes (``apply_element``
    moves the last two): ``(cols, rows, ...)`` for odd turns."""
    planes = np.moveaxis(np.asarray(array), (0, 1), (-2, -1))  # (..., rows, cols)
    return np.moveaxis(apply_element(planes, g), (-2, -1), (0, 1))


def move_assembled(arrays: dict, g: int) -> dict:
    """:func:`app.slides.run.assemble`'s arrays of a slide moved by g: what the moved slide's run should give."""
    return dict(probabilities=move_cells(arrays["probabilities"], g), evaluated=move_cells(arrays["evaluated"], g),
                tissue=move_cells(arrays["tissue"], g),
                attention={reading: move_cells(maps, g) for reading, maps in arrays["attention"].items()})


def compare_moved(original: dict, moved: dict, g: int) -> MovedComparison:
    """The run of the slide moved by ``g`` (``moved``) against the original's run (``original``) moved by g, both
    :func:`app.slides.run.assemble`'s arrays.

    Raises:
        ValueError: grids that g does not map onto each other (different slides, scales or models).
    """
    expected = move_assembled(original, g)
    if expected["evaluated"].shape != moved["evaluated"].shape:
        raise ValueError(f"the original's {original['evaluated'].shape} cells moved by element {g} are "
                         f"{expected['evaluated'].shape}, not the moved run's {moved['evaluated'].shape}: these "
                         "runs are not of one slide, scale and model")
    both = expected["evaluated"] & moved["evaluated"]
    attention = {}
    for reading in expected["attention"].keys() & moved["attention"].keys():
        a, b = expected["attention"][reading], moved["attention"][reading]
        held = np.isfinite(a) & np.isfinite(b)
        attention[reading] = _largest(np.abs(a[held].astype(np.float64) - b[held]))
    return MovedComparison(
        probability_difference=_largest(np.abs(expected["probabilities"][both] - moved["probabilities"][both])),
        attention_difference=attention,
        tissue_difference=_largest(np.abs(expected["tissue"][both] - moved["tissue"][both])),
        cells_compared=int(both.sum()),
        cells_in_one_only=int((expected["evaluated"] != moved["evaluated"]).sum()))


def _largest(differences: np.ndarray) -> float:
    return float(differences.max()) if differences.size else float("nan")
