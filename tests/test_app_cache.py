"""The analysis cache: keys that tell inputs apart, least-recently-used eviction, bounded concurrency."""

import threading

import numpy as np

from app.analysis.cache import LRUCache, analysis_key, image_digest
from app.analysis.reductions import MapSelection


def test_keys_tell_images_elements_and_selections_apart():
    image = np.zeros((1, 4, 4), np.float32)
    other = image.copy()
    other[0, 0, 0] = 1e-7
    assert image_digest(image) == image_digest(image.copy()) != image_digest(other)
    assert image_digest(image) != image_digest(image.reshape(1, 2, 8))  # same bytes, other shape
    key = analysis_key("m", image, 0)
    assert key == analysis_key("m", image.copy(), 0, {})
    assert key != analysis_key("m", image, 1) and key != analysis_key("n", image, 0)
    assert key != analysis_key("m", image, 0, {"c2": MapSelection(channel=1)})
    assert hash(analysis_key("m", image, 0, {"c2": MapSelection(channel=1), "c1": MapSelection()}))


def test_lru_eviction_and_reuse():
    cache, calls = LRUCache(maxsize=2), []

    def compute(value):
        return lambda: calls.append(value) or value

    assert cache.get_or_compute("a", compute(1)) == 1
    assert cache.get_or_compute("b", compute(2)) == 2
    assert cache.get_or_compute("a", compute(99)) == 1  # cached, and now most recent
    cache.get_or_compute("c", compute(3))  # evicts b
    assert cache.get_or_compute("b", compute(4)) == 4
    assert calls == [1, 2, 3, 4] and len(cache) == 2


def test_no_more_than_concurrency_computations_run_at_once():
    cache = LRUCache(maxsize=32, concurrency=2)
    running, most, lock = 0, 0, threading.Lock()
    release = threading.Event()

    def compute():
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        release.wait(timeout=5)  # everyone piles up until the main thread lets them go
        with lock:
            running -= 1
        return "done"

    threads = [threading.Thread(target=cache.get_or_compute, args=(key, compute)) for key in range(8)]
    for thread in threads:
        thread.start()
    threading.Event().wait(0.3)  # time for all eight to reach the cache
    assert running == 2, "two computations in flight, six waiting for a slot"
    release.set()
    for thread in threads:
        thread.join(timeout=10)
    assert most == 2 and len(cache) == 8
