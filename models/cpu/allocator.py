"""Keep freed memory in the process, so that each forward (and backward) pass reuses pages instead of faulting in
new ones.

glibc's malloc serves large blocks (above a threshold that starts at 128 KiB
and rises to at most 32 MiB) with fresh ``mmap`` pages and returns them to the
system when they are freed; it also trims the top of the heap. A forward pass
allocates and frees hundreds of megabytes of activations (a training step of
the p4m DenseNet at batch 64, gigabytes), so the next pass touches every page
anew, one page fault per 4 KiB, each zeroed by the kernel. For the p4m DenseNet
over the 8 transforms of a 96 x 96 patch those faults take about a third of the
forward pass (``python -m benchmarks.app_latency`` prints the forward pass
before and after, side by side); in its training step, more than half
(``python -m benchmarks.densenet_step``).

With ``mmap`` off and trimming off, freed memory stays in the heap for the
next request. The price: the process keeps the memory of its largest request
(about 600 MB for the app's DenseNet) instead of shrinking between requests,
and freed blocks of other sizes leave holes: a p4m DenseNet training step at
batch 64 holds about twice the memory it does with glibc's default (4.3 against
2.0 GiB). ``AAGC_KEEP_FREED_MEMORY=0`` keeps glibc's default. The app and
``python -m training`` call :func:`retain_freed_memory` once at start-up.

That call covers the threads that share glibc's main arena. A thread with an arena of its own (glibc gives
threads their own, up to eight per core) still maps each block too large for its 64 MiB heaps afresh, whatever
the settings, and unmaps it when freed. Processes that compute on worker threads (a slide's Dask workers) are
therefore started with :func:`freed_memory_environ`: the same settings and one arena for every thread.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

__all__ = ["retain_freed_memory", "freed_memory_environ", "release_freed_memory"]

# mallopt parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_LARGEST_TRIM_THRESHOLD = 2**31 - 1  # an int; the heap is trimmed only when 2 GiB at its top are free


def retain_freed_memory() -> bool:
    """Tell glibc's malloc to keep freed memory for reuse. Returns False (and changes nothing) without glibc, or
    where ``AAGC_KEEP_FREED_MEMORY=0`` asks for glibc's default (less memory held, slower steps)."""
    if os.environ.get("AAGC_KEEP_FREED_MEMORY", "1") == "0":
        return False
    mallopt = _glibc("mallopt", (ctypes.c_int, ctypes.c_int))
    if mallopt is None:
        return False
    return mallopt(_M_MMAP_MAX, 0) == 1 and mallopt(_M_TRIM_THRESHOLD, _LARGEST_TRIM_THRESHOLD) == 1


def release_freed_memory() -> bool:
    """Give the memory freed and kept so far back to the system (glibc's ``malloc_trim(0)``: the heap's free top,
    and the free pages inside it): for a process about to do other work than the requests whose memory it kept.
    The next such request faults its pages in again. Returns False without glibc."""
    trim = _glibc("malloc_trim", (ctypes.c_size_t,))
    if trim is None:
        return False
    trim(0)
    return True


def _glibc(name: str, argtypes: tuple):
    """glibc's function ``name`` (returning an int), or None where the C library is not glibc (musl, macOS,
    Windows)."""
    try:
        function = getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = argtypes
    function.restype = ctypes.c_int
    return function


def freed_memory_environ() -> dict[str, str]:
    """Environment variables that give a process started with them :func:`retain_freed_memory`'s settings from its
    first allocation, with one malloc arena shared by all its threads (see the module's docstring); empty where
    ``AAGC_KEEP_FREED_MEMORY=0``.

    Measured in a Dask worker (two threads, 16 contexts of the PCam DenseNet a pass each): with Dask's own setting
    (``MALLOC_TRIM_THRESHOLD_=65536``, which also pins the mmap threshold at 128 KiB) about 200,000 page faults a
    pass, 0.36 s of system time beside 0.5 s of computing; with :func:`retain_freed_memory` called in the worker,
    50,000 (its threads' own arenas); with these, none after the first pass.
    """
    if os.environ.get("AAGC_KEEP_FREED_MEMORY", "1") == "0":
        return {}
    return {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(_LARGEST_TRIM_THRESHOLD)}
