"""How often the Slide page looks for an analysis's finished chunks: about as often as chunks finish.

A refresh costs the server a rerun of the viewer's fragment and the browser a message, whether or not a chunk came
in. At two a second on the gigapixel slide, where a chunk came every 2 s or so, three refreshes in four found
nothing. The interval follows the measured rate (:attr:`app.slides.schedule.Progress.rate`) in powers of two of
:data:`SHORTEST_S`, so that a rate that wobbles keeps its interval: Streamlit sets a fragment's interval when the page
runs, so that a new one costs a run of the whole page.

While every chunk of the view is in (and the rest of the slide still runs), a refresh can change nothing drawn: only
the status line's counts. The interval is then at least :data:`VIEW_DONE_S`. On the gigapixel slide the view's six
chunks are in after about 13 s; refreshing at the chunks' rate (0.5 s) after that too, the server and Chromium took
17 % of the machine's CPU over the first minute of analysis, 11-14 % with this (docs/slides.md). A pan or zoom to
chunks not yet in shortens it again at once (the view's report reruns the viewer, which finds the interval no
longer suits).
"""

from __future__ import annotations

import math

__all__ = ["SHORTEST_S", "LONGEST_S", "VIEW_DONE_S", "refresh_interval", "keeps_interval"]

SHORTEST_S = 0.5  # before the rate is known (the first cells come within it), and whenever chunks come faster
LONGEST_S = 4.0  # at most: the status line's counts and time left stay current on a slow cluster
VIEW_DONE_S = 2.0  # at least, while the view's chunks are all in: the status line's counts still move
# An interval is kept while a chunk's time is within this factor of it, beyond the powers of two it sits between.
SLACK = math.sqrt(2)


def _measured(rate: float | None) -> bool:
    return bool(rate) and rate > 0 and math.isfinite(rate)


def refresh_interval(rate: float | None, view_done: bool = False) -> float:
    """Seconds between refreshes for chunks finishing at ``rate`` a second (None or 0: not yet measured): the
    longest power-of-two multiple of :data:`SHORTEST_S` that is at most one chunk's time, within
    [:data:`SHORTEST_S`, :data:`LONGEST_S`]; at least :data:`VIEW_DONE_S` where ``view_done`` (every chunk with
    tissue in the view is in)."""
    if not _measured(rate):
        return VIEW_DONE_S if view_done else SHORTEST_S
    steps = math.floor(math.log2(1.0 / (rate * SHORTEST_S)))
    by_rate = min(LONGEST_S, SHORTEST_S * 2.0 ** max(0, steps))
    return max(by_rate, VIEW_DONE_S) if view_done else by_rate


def keeps_interval(interval: float, rate: float | None, view_done: bool = False) -> bool:
    """Whether refreshing every ``interval`` seconds still suits chunks at ``rate`` a second: one chunk's time is
    within :data:`SLACK` of [interval, 2 * interval] (open-ended at :data:`SHORTEST_S` and :data:`LONGEST_S`).
    A rate not measured keeps the shortest interval only. Where ``view_done``, an interval under
    :data:`VIEW_DONE_S` no longer suits, and :data:`VIEW_DONE_S` itself suits any rate but a slower one (nothing in
    view waits to be drawn)."""
    if view_done and interval < VIEW_DONE_S:
        return False
    if not _measured(rate):
        return interval == (VIEW_DONE_S if view_done else SHORTEST_S)
    chunk_s = 1.0 / rate
    too_slow = interval > SHORTEST_S and chunk_s < interval / SLACK  # chunks wait too long to be drawn
    too_fast = interval < LONGEST_S and chunk_s > 2 * interval * SLACK  # most refreshes would find nothing
    if view_done and interval == VIEW_DONE_S:
        too_slow = False
    return not (too_slow or too_fast)
