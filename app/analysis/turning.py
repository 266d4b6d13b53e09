"""One layer's maps while the image turns through a whole circle, and how far from equivariant each step is.

The page's "Watch it turn" plays these: the image rotated by every multiple of ``step`` degrees (bilinear,
:func:`app.analysis.transforms.rotate_by_angle`), the network run on all of them in batches of eight (the size
of one analysis: the memory of a page's request stays that of a patch), and one layer's maps of each, reduced
as the page shows them. Only quarter turns are group elements; at any other angle the image was resampled,
and the maps follow it only approximately. Each step's deviation is measured as the proof tab measures an
arbitrary angle (:func:`app.analysis.angles.disc_deviation`): maps(R x) against R maps(x), inside the inscribed
disc. Numpy in, numpy out; no Streamlit.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from models import Network

from .angles import disc_deviation
from .compute import display_group, user_features
from .frames import InputFrame
from .reductions import MapSelection, reduce_attention, upsample
from .transforms import rotate_by_angle

__all__ = ["TurnSequence", "turning_maps", "turning_chunks", "turn_degrees", "joined", "chunked", "BATCH", "STEP"]

BATCH = 8  # images per forward pass: the eight transforms of one analysis
STEP = 5.0  # degrees between the page's frames


def turn_degrees(step: float = STEP) -> np.ndarray:
    """The angles of a whole turn in steps of ``step`` degrees, 0 first.

    Raises:
        ValueError: a step that does not divide a quarter turn (the quarter turns must be among the angles).
    """
    steps_per_quarter = 90.0 / step if step > 0 else 0.0
    if step <= 0 or abs(steps_per_quarter - round(steps_per_quarter)) > 1e-9:
        raise ValueError(f"the step must divide 90 degrees, got {step}")
    return np.arange(0, 360, step, dtype=np.float64)


@dataclass(frozen=True)
class TurnSequence:
    """One layer's maps of the image turned step by step through 360 degrees.

    Attributes:
        degrees: ``(N,)`` the angles, 0 first, counter-clockwise as displayed.
        images: ``(N, C, S, S)`` the turned images in [0, 1].
        maps: ``(N, H, S, S)`` the layer's maps of each, upsampled to the image.
        deviations: ``(N,)`` max |maps(R x) - R maps(x)| / max |R maps(x)| inside the inscribed disc: round-off at
            quarter turns, interpolation elsewhere (the worst pixel).
        typical_deviations: ``(N,)`` mean |maps(R x) - R maps(x)| / mean |R maps(x)| there.
        probabilities: ``(N, classes)``.
    """

    degrees: np.ndarray
    images: np.ndarray
    maps: np.ndarray
    deviations: np.ndarray
    typical_deviations: np.ndarray
    probabilities: np.ndarray


def turning_maps(model: Network, card: dict, image: np.ndarray, layer_key: str, selection: MapSelection,
                 step: float = STEP) -> TurnSequence:
    """The maps of layer ``layer_key`` (``"attention/NAME"`` or ``"features/NAME"``, as the page names them) of
    ``image`` turned by every multiple of ``step`` degrees below 360: :func:`turning_chunks` joined.

    Raises:
        ValueError: a step that does not divide a quarter turn (the quarter turns must be among the angles), or a
            layer the model does not trace.
    """
    return joined(list(turning_chunks(model, card, image, layer_key, selection, step)))


def turning_chunks(model: Network, card: dict, image: np.ndarray, layer_key: str, selection: MapSelection,
                   step: float = STEP) -> Iterator[TurnSequence]:
    """:func:`turning_maps` a batch (:data:`BATCH` angles) at a time, 0 degrees first: what a viewer can play
    while the rest is computed. Joined, the chunks are exactly :func:`turning_maps`' sequence.

    Raises (at the first chunk):
        ValueError: as :func:`turning_maps`.
    """
    all_degrees = turn_degrees(step)
    kind, name = layer_key.split("/", 1)
    frame = InputFrame.from_card(card, model.group)
    dtype = next(model.parameters()).dtype
    size = image.shape[-1]
    group = display_group(model)
    unturned = None  # the maps at 0 degrees, which every step's deviation is measured against
    for start in range(0, len(all_degrees), BATCH):
        degrees = all_degrees[start:start + BATCH]
        images = np.stack([rotate_by_angle(image.astype(np.float32), d) for d in degrees])  # (B, C, S, S)
        with torch.inference_mode():
            logits, trace = model.trace(frame.to_network(torch.from_numpy(images).to(dtype)))
        if kind == "attention" and name in trace.attention:
            reduced = reduce_attention(frame.attention_to_user(trace.attention[name]), selection)
        elif kind == "features" and name in trace.features:
            reduced = user_features(trace.features[name], frame)
        else:
            raise ValueError(f"the model traces no layer {layer_key!r}")
        maps = upsample(reduced.float(), size).numpy()  # (B, H, S, S)
        unturned = maps[0] if unturned is None else unturned
        deviations, typical = np.array([disc_deviation(unturned, m, d, group) for m, d in zip(maps, degrees,
                                                                                                 strict=True)]).T
        yield TurnSequence(degrees, images, maps, deviations, typical, torch.softmax(logits.double(), dim=1).numpy())


def joined(chunks: list[TurnSequence]) -> TurnSequence:
    """Consecutive chunks of one sequence as one."""
    return TurnSequence(*(np.concatenate([getattr(c, name) for c in chunks]) for name in TurnSequence.__annotations__))


def chunked(sequence: TurnSequence, size: int = BATCH) -> Iterator[TurnSequence]:
    """``sequence`` in chunks of ``size`` angles, as :func:`turning_chunks` yields them."""
    for start in range(0, len(sequence.degrees), size):
        yield TurnSequence(*(getattr(sequence, name)[start:start + size] for name in TurnSequence.__annotations__))
