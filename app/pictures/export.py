"""Export of an analysis as one NPZ file: named arrays plus a JSON metadata string.

Array names and shapes (T transforms, C channels, S image side, H orientations,
X x Y a layer's map, P arrow positions):

====================================  ==================  ===========================================
name                                  shape               content
====================================  ==================  ===========================================
``images``                            ``(T, C, S, S)``    the transformed images g.x, in [0, 1]
``elements``                          ``(T,)``            group element index of each transform
``probabilities``                     ``(T, classes)``    class probabilities of each g.x
``{kind}/{layer}/maps``               ``(T, H, X, Y)``    maps(g.x); kind is attention or features
``{kind}/{layer}/expected``           ``(T, H, X, Y)``    g.maps(x), the proof's other side
``{kind}/{layer}/max_abs_error``      ``(T,)``            max abs of their difference
``{kind}/{layer}/relative_error``     ``(T,)``            that over max abs of ``expected``
``arrows/positions``                  ``(P, 2)``          (row, column) of the arrows
``arrows/directions``                 ``(H, 2)``          unit (d_row, d_column) per orientation
``arrows/lengths``                    ``(T, H, P)``       strength / scale
``arrows/orientation_ids``            ``(H,)``            group element of each orientation
``arrows/mirrored``                   ``(H,)``            mirrored orientation (p4m)
``metadata``                          ``()``              JSON string, see :func:`export_npz`
====================================  ==================  ===========================================

Nothing in the file needs unpickling: read it with ``np.load(..., allow_pickle=False)``
or :func:`read_npz`.
"""

from __future__ import annotations

import dataclasses
import io
import json

import numpy as np

from ..analysis.compute import Analysis
from .arrows import ArrowField

__all__ = ["export_npz", "read_npz"]


def export_npz(
    analysis: Analysis,
    layers: list[str] | None = None,
    field: ArrowField | None = None,
    field_layer: str = "",
    extra: dict | None = None,
) -> bytes:
    """The analysis (or some of its layers) and an arrow field as NPZ bytes.

    Args:
        analysis: from :func:`app.analysis.compute.analyse`.
        layers: layer names to include (attention and features of each); None for all.
        field: an arrow field to include, computed from layer ``field_layer``.
        field_layer: the layer the field belongs to, recorded in the metadata.
        extra: more JSON-serialisable metadata (model name, checkpoint, image source, ...).

    Returns:
        The ``.npz`` file's bytes. Its ``metadata`` is a JSON object with ``group``,
        ``equivariant``, ``element_names``, ``class_names``, ``layers`` (per
        ``kind/layer``: layout, description, shape and selection), ``arrows``
        (layer, scale, spacing, image_size) and ``extra``.
    """
    arrays: dict[str, np.ndarray] = {
        "images": analysis.images,
        "elements": np.array(analysis.elements),
        "probabilities": analysis.probabilities,
    }
    described = {}
    for kind, maps in (("attention", analysis.attention), ("features", analysis.features)):
        for name, layer in maps.items():
            if layers is not None and name not in layers:
                continue
            key = f"{kind}/{name}"
            for part in ("maps", "expected", "max_abs_error", "relative_error"):
                arrays[f"{key}/{part}"] = getattr(layer, part)
            described[key] = dict(layout=layer.layout, description=layer.description, shape=list(layer.maps.shape),
                                  selection=dataclasses.asdict(layer.selection))
    arrows = None
    if field is not None:
        for part in ("positions", "directions", "lengths", "orientation_ids", "mirrored"):
            arrays[f"arrows/{part}"] = getattr(field, part)
        arrows = dict(layer=field_layer, scale=field.scale, spacing=field.spacing, image_size=field.image_size)
    metadata = dict(
        group=analysis.group,
        equivariant=analysis.equivariant,
        element_names=list(analysis.element_names),
        class_names=list(analysis.class_names),
        layers=described,
        arrows=arrows,
        extra=extra or {},
    )
    arrays["metadata"] = np.array(json.dumps(metadata))
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def read_npz(data: bytes) -> tuple[dict[str, np.ndarray], dict]:
    """The arrays and the metadata of an :func:`export_npz` file, without unpickling anything."""
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    metadata = json.loads(str(arrays.pop("metadata")))
    return arrays, metadata
