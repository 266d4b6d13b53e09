"""The process-wide caches every page shares: analyses by (model, image, element, selections) and each model's
padding borders. Models themselves are cached where they are loaded (:mod:`app.ui.inputs`)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import streamlit as st

from ..analysis.cache import LRUCache, analysis_key, image_digest
from ..analysis.compute import Analysis, analyse
from ..analysis.padding import stored_borders
from ..analysis.reductions import MapSelection
from ..analysis.stain_stability import StainStability, stain_reference, stain_stability
from ..analysis.turning import TurnSequence, chunked, joined, turning_chunks
from .inputs import LoadedModel

__all__ = ["analyses", "analysed", "turned", "padding_of", "stain_stable"]


@st.cache_resource
def analyses() -> LRUCache:
    """Analyses by (model id, image digest, element, selections), and plain-versus-equivariant comparisons by
    (both model ids, image digest, element): one process-wide LRU.

    ``$APP_CONCURRENT_ANALYSES`` (default 2) analyses run at once, whatever the number of sessions, which bounds
    the server's memory (``python -m benchmarks.concurrent_sessions``). Eight entries hold the Variants view's five
    digit models beside the patch page's analyses.
    """
    return LRUCache(maxsize=8, concurrency=int(os.environ.get("APP_CONCURRENT_ANALYSES", "2")))


def analysed(loaded: LoadedModel, image, element: int, selections: dict) -> tuple[Analysis, tuple]:
    """``loaded``'s analysis of ``image`` moved by ``element``, computed once, and its cache key."""
    key = analysis_key(loaded.model_id, image, element, selections)
    return analyses().get_or_compute(key, lambda: analyse(loaded.model, loaded.card, image, element, selections)), key


def turned(loaded: LoadedModel, image, layer_key: str, selection: MapSelection) -> Iterator[TurnSequence]:
    """``loaded``'s maps of layer ``layer_key`` while ``image`` turns through 360 degrees, a batch of angles at a
    time (:func:`app.analysis.turning.turning_chunks`), 0 degrees first, so that the page can send each as it is
    computed. Computed once: the joined sequence goes into the analyses' cache when the last chunk is done (it bounds
    memory and concurrency the same way), and is handed out in the same chunks from there."""
    cache = analyses()
    key = ("turning", loaded.model_id, image_digest(image), layer_key, selection)
    sequence = cache.get(key)
    if sequence is not None:
        yield from chunked(sequence)
        return
    chunks = []
    with cache.slot():
        for chunk in turning_chunks(loaded.model, loaded.card, image, layer_key, selection):
            chunks.append(chunk)
            yield chunk
    cache.put(key, joined(chunks))


def stain_stable(loaded: LoadedModel, image, method: str, border: int, element: int = 0,
                 degrees: float = 0.0) -> StainStability:
    """``loaded``'s stain stability of ``image`` (the patch as scanned) against ``method``'s normalisation to its
    card's reference (:func:`app.analysis.stain_stability.stain_stability`), computed once per (model, image,
    method, border, geometry) in the analyses' cache, which bounds its memory and concurrency as theirs."""
    key = ("stain-stability", loaded.model_id, image_digest(image), method, int(border), int(element), float(degrees))
    return analyses().get_or_compute(key, lambda: stain_stability(
        loaded.model, loaded.card, image, stain_reference(loaded.card), method, border, element, degrees))


@st.cache_resource(max_entries=16)
def padding_of(model_id: str, _loaded: LoadedModel) -> dict[str, int]:
    """Once per model: every layer's padding border, measured on constant images (:mod:`app.analysis.padding`),
    or read from the store the last measurement (or ``python -m app.warm``) left."""
    return stored_borders(_loaded.model, _loaded.card)
