"""How often the Slide page looks for an analysis's finished chunks: about as often as chunks finish.

A refresh costs the server a rerun of the viewer's fragment and the browser a message, whether or not a chunk came
in. At two a second on the gigapixel slide, where a chunk came every 2 s or so, three refreshes in four found
nothing. The interval follows the measured rate (:attr:`app.slides.schedule.Progress.rate`) in powers of two of
:data:`SHORTEST_S`, so that a rate that wobbles keeps its interval: Streamlit sets a fragment's interval when the page
runs, so that a new one costs a run of the whole page.
"""

from __future__ import annotations

import math

__all__ = ["SHORTEST_S", "LONGEST_S", "refresh_interval", "keeps_interval"]

SHORTEST_S = 0.5  # before the rate is known (the first cells come within it), and whenever chunks come faster
LONGEST_S = 4.0  # at most: the status line's counts and time left stay current on a slow cluster
# An interval is kept while a chunk's time is within this factor of it, beyond the powers of two it sits between.
SLACK = math.sqrt(2)


def _measured(rate: float | None) -> bool:
    return bool(rate) and rate > 0 and math.isfinite(rate)


def refresh_interval(rate: float | None) -> float:
    """Seconds between refreshes for chunks finishing at ``rate`` a second (None or 0: not yet measured): the
    longest power-of-two multiple of :data:`SHORTEST_S` that is at most one chunk's time, within
    [:data:`SHORTEST_S`, :data:`LONGEST_S`]."""
    if not _measured(rate):
        return SHORTEST_S
    steps = math.floor(math.log2(1.0 / (rate * SHORTEST_S)))
    return min(LONGEST_S, SHORTEST_S * 2.0 ** max(0, steps))


def keeps_interval(interval: float, rate: float | None) -> bool:
    """Whether refreshing every ``interval`` seconds still suits chunks at ``rate`` a second: one chunk's time is
    within :data:`SLACK` of [interval, 2 * interval] (open-ended at :data:`SHORTEST_S` and :data:`LONGEST_S`).
    A rate not measured keeps the shortest interval only."""
    if not _measured(rate):
        return interval == SHORTEST_S
    chunk_s = 1.0 / rate
    too_slow = interval > SHORTEST_S and chunk_s < interval / SLACK  # chunks wait too long to be drawn
    too_fast = interval < LONGEST_S and chunk_s > 2 * interval * SLACK  # most refreshes would find nothing
    return not (too_slow or too_fast)
