"""The first visitor's page, computed before they come: ``app/server.py`` runs :func:`prepare_first_visit` at
start-up, before the server answers any request.

Without it the first visitor waits for the page's imports (torch, matplotlib, plotly: 1.4 s of a 1.8 s first
script run with AVX2 code on a Xeon, 2026-11-29) and for the default page's numbers (the default checkpoint loaded,
its padding borders, the first gallery patch analysed in the default reading: 0.3 s). Here they go into the
process-wide caches the page reads (``st.cache_resource``, :mod:`app.ui.caches`), through the page's own functions
and so under the page's own keys: the default page then finds them, and any other page is computed as before.
"""

from __future__ import annotations

from pathlib import Path

from ..analysis.checkpoints import list_checkpoints
from ..analysis.images import fit_to_model
from ..analysis.readings import layer_selections, page_readings
from .caches import analysed, padding_of
from .inputs import checkpoint_folder, decoded, default_checkpoint, gallery_order, load_entry
from .page import allocator_tuned  # importing the page loads every module a session needs, once per process

__all__ = ["prepare_first_visit"]


def prepare_first_visit(folder: Path | None = None) -> str:
    """Load and compute what the default page of ``folder`` (default ``$APP_CHECKPOINTS`` or ``checkpoints/``)
    shows, into the page's caches; a sentence saying what was prepared, or why nothing was.

    Never raises for a bad checkpoint or image: the page says what is wrong when it is visited.
    """
    allocator_tuned()
    entries = list_checkpoints(folder or checkpoint_folder())
    if not entries:
        return "no checkpoint to prepare: the page will say how to add one"
    entry = entries[default_checkpoint(entries)]
    if entry.error:
        return f"{entry.name} not prepared: {entry.error}"
    loaded = load_entry(entry)
    padding_of(loaded.model_id, loaded)
    size, channels = int(loaded.card["input"]["size"]), int(loaded.card["input"]["channels"])
    _, items = gallery_order(loaded.card)
    # The gallery picker's first image, fitted as its default ("resize"), in the reading the page opens with.
    fitted = fit_to_model(decoded(items[0].path.read_bytes()), size, channels, "resize")
    readings = page_readings(loaded.model)
    selections = layer_selections(readings, readings.default) if readings.default else {}
    analysed(loaded, fitted.pixels, 0, selections)
    return f"{entry.name} on {items[0].name} is ready"
