"""A small thread-safe LRU cache of analyses, keyed by (model, image, transform, selections).

The UI loads each model once per process (``st.cache_resource``); analyses
depend on a model, the fitted image, the user's group element and the map
selections, and are cached here rather than with ``st.cache_data``, which would
hash (or pickle) the model and the result arrays on every rerun. Streamlit runs
sessions in threads, hence the lock; a computation runs outside it, so two
sessions may occasionally compute the same entry once each. At most
``concurrency`` computations run at once: with many sessions analysing at the
same moment the others wait their turn, so the server's peak memory is bounded
by that number of analyses in flight (and two cores gain nothing from more).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping

import numpy as np

from .reductions import MapSelection

__all__ = ["LRUCache", "image_digest", "analysis_key"]


def image_digest(image: np.ndarray | bytes) -> str:
    """SHA-256 of an image's bytes (and shape and dtype for arrays), as a cache key."""
    digest = hashlib.sha256()
    if isinstance(image, np.ndarray):
        digest.update(f"{image.shape}{image.dtype}".encode())
        image = np.ascontiguousarray(image).tobytes()
    digest.update(image)
    return digest.hexdigest()


def analysis_key(model_id: str, image: np.ndarray, element: int,
                 selections: Mapping[str, MapSelection] | None = None) -> tuple:
    """The cache key of ``analyse(model, card, image, element, selections)``.

    Args:
        model_id: identifies the loaded model, e.g. the checkpoint's path or the upload's digest.
    """
    return model_id, image_digest(image), int(element), tuple(sorted((selections or {}).items()))


_MISSING = object()


class LRUCache:
    """At most ``maxsize`` values, the least recently used dropped first.

    An analysis of the 96 x 96 p4m DenseNet holds tens of MB of maps, so keep it small.
    """

    def __init__(self, maxsize: int = 8, concurrency: int = 0):
        self.maxsize = maxsize
        self._values: OrderedDict[Hashable, object] = OrderedDict()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(concurrency) if concurrency > 0 else None

    def get_or_compute(self, key: Hashable, compute: Callable[[], object]):
        """The cached value of ``key``, or ``compute()`` stored under it (waiting for a free slot first)."""
        found = self.get(key, _MISSING)
        if found is not _MISSING:
            return found
        with self.slot():
            value = compute()
        self.put(key, value)
        return value

    def get(self, key: Hashable, default=None):
        """The cached value of ``key`` (now the most recently used), or ``default``."""
        with self._lock:
            if key not in self._values:
                return default
            self._values.move_to_end(key)
            return self._values[key]

    def put(self, key: Hashable, value) -> None:
        """Store ``value`` under ``key``, dropping the least recently used beyond ``maxsize``."""
        with self._lock:
            self._values[key] = value
            self._values.move_to_end(key)
            while len(self._values) > self.maxsize:
                self._values.popitem(last=False)

    def slot(self) -> contextlib.AbstractContextManager:
        """One of the ``concurrency`` computations allowed at once, held while the ``with`` block runs (for a
        computation delivered in pieces, where :meth:`get_or_compute` does not fit)."""
        return contextlib.nullcontext() if self._slots is None else self._slots

    def __len__(self) -> int:
        return len(self._values)
