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
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                return self._values[key]
        if self._slots is None:
            value = compute()
        else:
            with self._slots:
                value = compute()
        with self._lock:
            self._values[key] = value
            self._values.move_to_end(key)
            while len(self._values) > self.maxsize:
                self._values.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._values)
