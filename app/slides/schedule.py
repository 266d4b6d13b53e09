"""The chunks of every slide analysed in this process fed to one Dask client, in the order a pathologist needs them:
those in the viewer's current view first, then the rest of the slide coarse to fine, the cluster shared fairly
between the slides being analysed.

One :class:`ChunkScheduler` per server process (:func:`scheduler_for`) holds a queue of waiting chunks per analysis
(a :class:`app.slides.run.SlidePlan`, keyed by its store's name, so that two sessions of one slide and model share
one analysis) and keeps only a few tasks on the cluster at a time: its threads and :data:`SLOT_MARGIN` more. Each
task is :func:`app.slides.run.submit_chunk`'s (its key, :func:`app.slides.run.timed_chunk_task`); a finished chunk
goes into its plan's store in Dask's callback thread, as :func:`app.slides.run.start_slide` does, and the next
waiting chunk is chosen then.

Why a queue here and not Dask's priorities: a submitted task's priority cannot be changed (dask/dask#3874 closed
without it, dask/distributed#1753 open), so with everything submitted at once a pan could only re-order by cancelling
the new view's tasks and submitting them again at a higher priority, and two slides could only be interleaved by
priorities fixed when each was submitted. Measured with a stub chunk (a sleep) on one worker of two threads
(``python -m benchmarks.schedule_pan``, 2-core AMD EPYC, AVX2 only, shared with other work), from a pan to the first
chunk of the new view finished, median of 3, with 0.5 s chunks: this queue 1.00 s with one task beyond the threads
(0.99 s with none, 1.47 s with two), cancel and resubmit at a higher priority 1.00 s, all submitted at once as before
63 s (the view's chunks late in the order); with 50 ms chunks: the queue 0.10 s, cancel and resubmit 0.83 s
(``client.cancel`` waits on the scheduler). Cancel and resubmit also cancels tasks already running (the client
cannot tell which have started) and leaves fairness to fixed priorities; the queue gets re-ordering, fairness and
stopping from one rule: what waits is ours to choose from. Its cost is a round trip to the scheduler per chunk
between one task and the next, which :data:`SLOT_MARGIN` hides: 121 chunks of 50 ms took 4.05 s with no task beyond
the threads, 3.60 s with one, 3.56 s with two, and 3.56 s all at once (median of 4; 3.03 s ideal). A pan waits for
the tasks already on the cluster: a chunk's time and ``SLOT_MARGIN / threads`` more at most.

The order within an analysis: the waiting chunks in the current view (of any of its sessions) first, the one nearest
the view's centre first and the rest of the view spread out (:func:`app.slides.order.spread_order` over the view's
chunks: at the whole slide's zoom the whole map shows and sharpens rather than a disc growing from the centre), then
the rest of the slide by the spread order. A new view re-orders what is still waiting. A view is clamped to the slide
(:func:`app.slides.order.clamp_view`); a view over glass holds no chunk, so nothing moves. One exception, the very
first chunk of an analysis: the view's quickest (the least tissue; the view's centre on a tie), so that the first cells
are drawn within a second of Analyse, with the centre's chunk beside it on the cluster's other thread.

Fairness: a free slot goes to the analysis with the fewest tasks on the cluster, the one served longest ago on a
tie, among the analyses someone looks at (a view or an Analyse of a session); an analysis nobody looks at any more
(:meth:`ChunkScheduler.stop`: its slide closed, another chosen; or no word from its sessions for
:data:`VIEWER_TIMEOUT_S`: a tab closed) keeps its finished chunks and carries on in the background, with the slots
that no looked-at analysis wants. :meth:`ChunkScheduler.forget` drops one's waiting chunks instead. A finished
analysis lets go of its plan and futures; a short record of its counts stays. Measured as above (0.5 s chunks): a
slide of 9 chunks took 2.62 s alone, 5.21 s started second beside one of 289 (twice), and 74 s with both submitted
at once.

Thread safety: every public method takes the scheduler's lock for bookkeeping only, never waits on the cluster
(a submit is a message sent by the client's event loop), and may be called from any thread: Streamlit's script
threads and Dask's callback thread.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from .order import ChunkLayout, Index, View, clamp_view, spread_order
from .reader import SlideError
from .run import SlidePlan, submit_chunk, tissue_share

__all__ = ["ChunkScheduler", "Progress", "scheduler_for", "current_scheduler", "SLOT_MARGIN", "RATE_WINDOW",
           "VIEWER_TIMEOUT_S"]

# Tasks on the cluster beyond its threads: a finished thread's next chunk is already there, not a round trip away
# (the module docstring's figures: none cost 14 % on 50 ms chunks, one as good as all at once), and a pan's first
# chunk starts behind at most this many more.
SLOT_MARGIN = 1
RATE_WINDOW = 16  # finished chunks over which an analysis's rate is measured
SLOTS_REFRESH_S = 10.0  # how often the cluster's threads are counted again (workers come and go)
FINISHED_KEPT = 64  # records of finished analyses kept for their pages' last refresh
# A viewer that has not called for this long has gone (a tab closed calls no stop); a page that shows a running
# analysis asks for its progress every second or so.
VIEWER_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Progress:
    """An analysis as its page shows it.

    Attributes:
        key: the store's name (``plan.store.folder.name``).
        state: ``"running"`` (looked at), ``"background"`` (stopped: nobody looks, it runs on spare slots),
            ``"done"`` (every chunk finished or failed), ``"forgotten"`` or ``"lost"`` (the scheduler stopped
            answering: :attr:`lost` says so).
        done, total: chunks stored, of those with tissue (stored before this analysis included).
        in_view_done, in_view: of the chunks with tissue in the current views.
        running: tasks of this analysis on the cluster now.
        failed: chunks whose task raised (not retried until the next Analyse).
        rate: chunks per second of wall time over its last :data:`RATE_WINDOW` finished ones (its share of the
            cluster as it is now; None before two have finished).
        seconds_left: what is still to do at that rate (None while unknown).
        worker_seconds: the workers' time on its chunks so far (each task's own clock).
        errors: a sentence per failed chunk.
        lost: the sentence when the scheduler stopped answering, else None.
        version: chunks of its store finished by this scheduler so far, an Analyse again counting on
            (:meth:`ChunkScheduler.finished_since`).
    """

    key: str
    state: str
    done: int
    total: int
    in_view_done: int
    in_view: int
    running: int
    failed: int
    rate: float | None
    seconds_left: float | None
    worker_seconds: float
    errors: tuple[str, ...]
    lost: str | None
    version: int

    def sentence(self) -> str:
        """``In view: 3 of 12 chunks. Slide: 120 of 1,961 chunks, about 14 min left at 2.1 chunks/s.``"""
        if self.lost:
            return self.lost[0].upper() + self.lost[1:] + "."
        view = f"In view: {self.in_view_done:,} of {self.in_view:,} chunks. " if self.in_view else ""
        slide = f"Slide: {self.done:,} of {self.total:,} chunks"
        if self.state == "done":
            tail = f", {self.failed:,} failed." if self.failed else ", done."
        elif self.seconds_left is None:
            tail = ", time left not yet measured."
        else:
            tail = f", about {_duration(self.seconds_left)} left at {self.rate:.2g} chunks/s."
        if self.state == "background":
            tail = tail[:-1] + " (in the background)."
        return view + slide + tail


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(seconds, 1):.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class _Analysis:
    """One slide's analysis as the scheduler holds it; every field is read and written under its lock."""

    def __init__(self, plan: SlidePlan, layout: ChunkLayout, missing: list[Index], now: float):
        self.key = plan.store.folder.name
        self.plan: SlidePlan | None = plan
        self.layout = layout
        self.total = len(plan.chunks)
        self.waiting = set(missing)
        self.done = set(plan.chunks) - self.waiting
        self.order = [index for index in spread_order(plan.chunks) if index in self.waiting]
        self.cursor = 0
        self.view_order: list[Index] = []
        self.view_cursor = 0
        self.in_view: frozenset[Index] = frozenset()
        self.viewers: dict[str, View | None] = {}
        self.seen: dict[str, float] = {}  # when each viewer last called (a closed tab calls no stop)
        self.view_version = 0
        self.in_flight: dict[str, tuple[Index, object]] = {}
        self.fetching = 0  # finished on the cluster, its result on its way into the store
        self.finished: list[Index] = []
        self.errors: list[str] = []
        self.failed = 0
        self.worker_seconds = 0.0
        self.times: deque[float] = deque([now], maxlen=RATE_WINDOW + 1)
        self.served = 0
        self.forgotten = False
        self.quick_first = True  # the first chunk taken is the quickest of the view (:meth:`_quickest`)

    def next_chunk(self) -> Index | None:
        """The next waiting chunk, taken from the waiting: the view's first, then the spread order's; the very first
        the quickest of the view (:meth:`_quickest`)."""
        if self.quick_first:
            self.quick_first = False
            quickest = self._quickest()
            if quickest is not None:
                self.waiting.discard(quickest)
                return quickest
        for order, attribute in ((self.view_order, "view_cursor"), (self.order, "cursor")):
            cursor = getattr(self, attribute)
            while cursor < len(order):
                index = order[cursor]
                cursor += 1
                if index in self.waiting:
                    setattr(self, attribute, cursor)
                    self.waiting.discard(index)
                    return index
            setattr(self, attribute, cursor)
        return None

    def _quickest(self) -> Index | None:
        """The waiting chunk of the view (without a view, of the slide) with the least tissue, the one nearest the
        view's centre on a tie: the first chunk an analysis submits. The first cells are then drawn within a second of
        Analyse (a chunk on the tissue's edge, a few cells), where the view's centre, a full chunk at a tissue's
        inside, takes seconds (64 cells: 3-4 s of a core); the centre's chunk is submitted with it and runs beside it
        on the cluster's other thread, so it comes no later. Every cell stays exact and the store's chunks are
        unchanged: only which whole chunk goes first."""
        candidates = [index for index in self.view_order if index in self.waiting]
        if not candidates:  # no view: the slide's chunks are the least tissue first (the plan's order)
            return next((index for index in self.plan.chunks if index in self.waiting), None)
        share = partial(tissue_share, self.plan.grid, self.plan.tissue)
        return min(enumerate(candidates), key=lambda pair: (share(*pair[1]), pair[0]))[1]

    def waiting_order(self) -> list[Index]:
        """The waiting chunks in the order they would be submitted."""
        listed = [i for i in self.view_order[self.view_cursor:] if i in self.waiting]
        seen = set(listed)
        return listed + [i for i in self.order[self.cursor:] if i in self.waiting and i not in seen]

    def progress(self, state: str, lost: str | None) -> Progress:
        rate = None
        if len(self.times) >= 2 and self.times[-1] > self.times[0]:
            rate = (len(self.times) - 1) / (self.times[-1] - self.times[0])
        left = len(self.waiting) + len(self.in_flight) + self.fetching
        return Progress(self.key, state, len(self.done), self.total, len(self.in_view & self.done), len(self.in_view),
                        len(self.in_flight), self.failed, rate, left / rate if rate else None, self.worker_seconds,
                        tuple(self.errors), lost, len(self.finished))


class ChunkScheduler:
    """Chunks of any number of analyses fed to ``client`` a few at a time (module docstring).

    Args:
        client: a ``dask.distributed.Client``.
        slots: tasks kept on the cluster at most; by default its threads and ``margin``, counted again every
            :data:`SLOTS_REFRESH_S` seconds from Dask's callback thread.
        address: the scheduler's address, for the sentence when it stops answering (None: the local cluster).
        submit: ``submit(client, plan, ci, cj)`` returning a future (:func:`app.slides.run.submit_chunk`).
        clock: seconds, for the rates.
    """

    def __init__(self, client, *, slots: int | None = None, margin: int = SLOT_MARGIN, address: str | None = None,
                 submit: Callable = submit_chunk, clock: Callable[[], float] = time.monotonic):
        self._client = client
        self._submit = submit
        self._clock = clock
        self._address = address
        self._margin = margin
        self._fixed_slots = slots
        self._lock = threading.RLock()
        self._analyses: dict[str, _Analysis] = {}
        self._records: OrderedDict[str, tuple[Progress, list[Index]]] = OrderedDict()
        self._served = 0
        self._lost: str | None = None
        self._closed = False
        self._slots = slots if slots is not None else self._cluster_threads() + margin
        self._slots_at = clock()

    @property
    def slots(self) -> int:
        """Tasks kept on the cluster at most, now."""
        return self._slots

    def analyse(self, plan: SlidePlan, viewer: str = "", view=None) -> Progress:
        """Start ``plan``'s analysis, or join the one running for its store, for ``viewer`` (a session's name: the
        analysis counts as looked at while any viewer has it), with ``view`` (:meth:`view`) if given. Reads which
        chunks its store holds (the disk, not the cluster); returns its progress at once."""
        key = plan.store.folder.name
        with self._lock:
            running = self._analyses.get(key)
        if running is None:
            missing = [index for index in plan.chunks if plan.store.get(*index) is None]
            layout = ChunkLayout(plan.grid, plan.chunks)
            with self._lock:
                running = self._analyses.get(key)
                if running is None:
                    running = _Analysis(plan, layout, missing, self._clock())
                    record = self._records.pop(key, None)
                    if record is not None:  # the versions of finished_since count on
                        running.finished = list(record[1])
                    self._analyses[key] = running
                    if not running.waiting:
                        self._finish(running)
        with self._lock:
            if self._analyses.get(key) is running:
                running.viewers.setdefault(viewer, None)
                running.seen[viewer] = self._clock()
        if view is not None:
            self.view(key, view, viewer)
        with self._lock:
            self._fill()
            return self._progress(key)

    def view(self, key: str, view, viewer: str = "") -> View | None:
        """``viewer``'s current view of analysis ``key``: ``(left, top, width, height)`` in level-0 pixels of the slide
        as its plan sees it, clamped (:func:`app.slides.order.clamp_view`; None or NaN: no view). The waiting chunks
        in the views go first from now on; a view without any (glass, off the slide, NaN) leaves the order as it
        was. Returns the view as clamped (None: no view, or no such analysis running)."""
        with self._lock:
            running = self._analyses.get(key)
            if running is None:
                return None
            clamped = clamp_view(view, running.layout.size)
            running.seen[viewer] = self._clock()
            if clamped is not None and running.viewers.get(viewer) == clamped:
                return clamped  # the view it holds (a page's rerun says it again): its order stands, nothing sorted
            running.viewers[viewer] = clamped
            views = [v for v in running.viewers.values() if v is not None]
            running.view_version += 1
            version = running.view_version
        order, in_view = running.layout.in_views(views)  # without the lock: a slide's worth of chunks
        with self._lock:
            if running.view_version == version and self._analyses.get(key) is running:
                running.in_view = in_view
                if order:  # a view over glass (or none) has nothing to put first: what waits keeps its order
                    running.view_order, running.view_cursor = order, 0
                self._fill()
        return clamped

    def stop(self, key: str, viewer: str | None = None) -> None:
        """``viewer`` (None: every viewer) no longer looks at analysis ``key`` (its slide closed, another chosen):
        its views stop counting, and once nobody looks it runs in the background, on the slots no looked-at
        analysis wants. Its finished chunks are in the store."""
        with self._lock:
            running = self._analyses.get(key)
            if running is None:
                return
            for name in list(running.viewers) if viewer is None else [viewer]:
                running.viewers.pop(name, None)
                running.seen.pop(name, None)
            running.view_version += 1
            version = running.view_version
            views = [v for v in running.viewers.values() if v is not None]
        order, in_view = running.layout.in_views(views)
        with self._lock:
            if running.view_version == version and self._analyses.get(key) is running:
                running.view_order, running.view_cursor, running.in_view = order, 0, in_view
                self._fill()

    def forget(self, key: str) -> None:
        """Drop analysis ``key``: its waiting chunks are not submitted, its tasks on the cluster are cancelled (in a
        thread of their own: a cancel waits for the scheduler); its finished chunks stay in the store."""
        with self._lock:
            running = self._analyses.pop(key, None)
            if running is None:
                return
            running.forgotten = True
            futures = [future for _, future in running.in_flight.values()]
            progress = running.progress("forgotten", self._lost)
            self._keep_record(key, progress, running.finished)
            running.in_flight.clear()
            running.waiting.clear()
            running.plan = None
            self._fill()
        if futures:
            threading.Thread(target=self._cancel, args=(futures,), daemon=True, name="chunk-cancel").start()

    def close(self) -> None:
        """Forget every analysis and submit nothing more."""
        with self._lock:
            keys = list(self._analyses)
            self._closed = True
        for key in keys:
            self.forget(key)

    def progress(self, key: str, viewer: str | None = None) -> Progress | None:
        """Analysis ``key``'s progress (a finished one's last, while it is among the last :data:`FINISHED_KEPT`);
        None for a store this scheduler has not analysed. ``viewer`` still looks: a viewer that has not called
        (:meth:`analyse`, :meth:`view`, this) for :data:`VIEWER_TIMEOUT_S` is taken for gone (a closed tab), as
        if stopped."""
        with self._lock:
            running = self._analyses.get(key)
            if running is not None and viewer is not None and viewer in running.viewers:
                running.seen[viewer] = self._clock()
            return self._progress(key)

    def finished_since(self, key: str, version: int = 0) -> tuple[int, list[Index]]:
        """The chunks of store ``key`` finished by this scheduler after its first ``version`` ones (an Analyse again
        counts on), in the order they finished, and the version to ask from next time: a refresh sends only what is
        new. A ``version`` beyond the count (a new scheduler counts from 0) gives them all."""
        with self._lock:
            running = self._analyses.get(key)
            finished = running.finished if running is not None else self._records.get(key, (None, []))[1]
            version = max(0, int(version))
            return len(finished), list(finished[version if version <= len(finished) else 0:])

    def waiting_order(self, key: str) -> list[Index]:
        """Analysis ``key``'s waiting chunks in the order they will be submitted ([] when none)."""
        with self._lock:
            running = self._analyses.get(key)
            return running.waiting_order() if running is not None else []

    def running(self) -> list[str]:
        """The keys of the analyses not yet finished."""
        with self._lock:
            return list(self._analyses)

    def _expire(self) -> None:
        """Viewers not heard from for :data:`VIEWER_TIMEOUT_S` dropped; an analysis left without any view loses its
        view's place (with some views left, their order stands until the next view)."""
        now = self._clock()
        for running in self._analyses.values():
            gone = [name for name, seen in running.seen.items() if now - seen > VIEWER_TIMEOUT_S]
            for name in gone:
                running.viewers.pop(name, None)
                running.seen.pop(name, None)
            if gone and not any(v is not None for v in running.viewers.values()):
                running.view_order, running.view_cursor, running.in_view = [], 0, frozenset()
                running.view_version += 1

    def _progress(self, key: str) -> Progress | None:
        self._expire()
        running = self._analyses.get(key)
        if running is None:
            record = self._records.get(key)
            return record[0] if record is not None else None
        state = "lost" if self._lost else "running" if running.viewers else "background"
        return running.progress(state, self._lost)

    def _fill(self) -> None:
        """Free slots filled from the analyses' waiting chunks (under the lock): looked-at analyses first, the one
        with the fewest tasks on the cluster, the one served longest ago on a tie."""
        if self._lost or self._closed:
            return
        self._expire()
        while sum(len(a.in_flight) for a in self._analyses.values()) < self._slots:
            wanting = [a for a in self._analyses.values() if a.waiting]
            watched = [a for a in wanting if a.viewers]
            if not wanting:
                return
            running = min(watched or wanting, key=lambda a: (len(a.in_flight), a.served))
            index = running.next_chunk()
            if index is None:  # waiting chunks not in any order: cannot happen, but never loop on it
                running.waiting.clear()
                continue
            try:
                future = self._submit(self._client, running.plan, *index)
            except Exception as err:  # noqa: BLE001 (a closed client or connection, whatever its kind)
                running.waiting.add(index)
                self._lose(err)
                return
            if not running.in_flight and not running.fetching:  # idle until now (new, or back from the background)
                running.times.clear()
                running.times.append(self._clock())
            self._served += 1
            running.served = self._served
            running.in_flight[future.key] = (index, future)
            future.add_done_callback(partial(self._arrived, running, index))

    def _arrived(self, running: _Analysis, index: Index, future) -> None:
        """A task of ``running`` ended (in Dask's callback thread): its slot given to the next waiting chunk at once
        (before its result is fetched and written: the worker's thread waits for no more than a round trip), then
        its chunk stored, or its error kept."""
        self._count_slots()
        with self._lock:
            if running.forgotten or running.in_flight.pop(future.key, None) is None:
                return
            running.fetching += 1
            plan = running.plan
            self._fill()
        status, outcome, seconds = future.status, None, 0.0
        if status == "finished":
            try:
                result, seconds = future.result()
            except Exception as err:  # noqa: BLE001 (cancelled, or the scheduler gone, since it finished)
                status, outcome = "cancelled", err
            else:
                try:
                    plan.store.put(result)
                except OSError as err:
                    status, outcome = "error", err
        elif status == "error":
            try:
                outcome = future.exception()
            except Exception as err:  # noqa: BLE001 (the scheduler went while its error was fetched)
                status, outcome = "cancelled", err
        with self._lock:
            running.fetching -= 1
            if running.forgotten:
                return
            if status == "finished":
                running.done.add(index)
                running.finished.append(index)
                running.times.append(self._clock())
                running.worker_seconds += seconds
            elif status == "error":
                running.failed += 1
                running.errors.append(_sentence(plan, index, outcome))
            else:  # cancelled, and not by this scheduler: its scheduler is gone
                running.waiting.add(index)
                self._lose(None)
            if not running.waiting and not running.in_flight and not running.fetching:
                self._finish(running)
            self._fill()

    def _finish(self, running: _Analysis) -> None:
        """Every chunk of ``running`` finished or failed: its plan and futures let go, a record of its counts kept."""
        self._analyses.pop(running.key, None)
        self._keep_record(running.key, running.progress("done", None), running.finished)
        running.plan = None
        running.in_flight.clear()

    def _keep_record(self, key: str, progress: Progress, finished: list[Index]) -> None:
        self._records[key] = (progress, finished)
        self._records.move_to_end(key)
        while len(self._records) > FINISHED_KEPT:
            self._records.popitem(last=False)

    def _lose(self, error: BaseException | None) -> None:
        del error  # a closed connection's own words name the socket, not the scheduler
        self._lost = (f"the Dask scheduler at {self._address or 'the local cluster'} stopped answering; the chunks "
                      "finished so far are stored, and Analyse resumes from them once it answers again")

    def _cluster_threads(self) -> int:
        """The cluster's threads now (0 where it does not answer: the margin's tasks wait for its workers)."""
        try:
            return sum(self._client.nthreads().values())
        except Exception:  # noqa: BLE001 (a scheduler that does not answer is said by the next submit)
            return 0

    def _count_slots(self) -> None:
        """The slots counted again if it is time (in Dask's callback thread, never a page's)."""
        if self._fixed_slots is not None or self._clock() - self._slots_at < SLOTS_REFRESH_S:
            return
        self._slots_at = self._clock()
        threads = self._cluster_threads()
        if threads:
            with self._lock:
                self._slots = threads + self._margin

    def _cancel(self, futures: list) -> None:
        try:
            self._client.cancel(futures)
        except Exception:  # noqa: BLE001 (a scheduler gone has cancelled them already)
            pass


def _sentence(plan: SlidePlan | None, index: Index, error: BaseException | None) -> str:
    """A failed chunk in words: a slide's own error (:class:`SlideError`, which names the file) as it is, any other
    with the slide's name, the chunk and the exception's kind."""
    if isinstance(error, SlideError):
        return f"{error} (chunk {index})"
    name = plan.slide.name if plan is not None else "the slide"
    return f"{name}: chunk {index} failed on a worker ({type(error).__name__}: {error})"


_SHARED: dict[str, object] = {}
_SHARED_LOCK = threading.Lock()


def scheduler_for(client, address: str | None = None) -> ChunkScheduler:
    """The process's one scheduler for ``client``: made at the first call (it counts the cluster's threads: call it
    where a wait for the cluster is acceptable, where the client is made), the same one after; a new client (the
    old one's scheduler lost) gets a new scheduler and the old one is closed."""
    with _SHARED_LOCK:
        if _SHARED.get("client") is not client:
            old = _SHARED.get("scheduler")
            if old is not None:
                old.close()
            _SHARED.update(client=client, scheduler=ChunkScheduler(client, address=address))
        return _SHARED["scheduler"]


def current_scheduler() -> ChunkScheduler | None:
    """The process's scheduler if :func:`scheduler_for` has made one, else None: for a page's refresh, which must not
    wait for a cluster to count its threads."""
    with _SHARED_LOCK:
        return _SHARED.get("scheduler")
