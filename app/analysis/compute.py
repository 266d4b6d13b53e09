"""One batched forward pass for every group transform of an image: predictions, maps and the live proof.

For an image x (in the user's frame) and every element g of the model's group
(p4 rotations for planar models, which have none), the network sees the batch
of all g.x at once, under ``torch.inference_mode()``; the model is only read.
Every attentive layer's effective attention and every convolution's features
are reduced to one map per orientation (:mod:`app.analysis.reductions`) in the user's
frame (:mod:`app.analysis.frames`).

The proof compares, per layer and per g, maps(g.x) (what the network computed
on the transformed image) with g.maps(x) (the maps of the original, moved by g:
planes with the image, orientation axes re-indexed). g is applied to the
un-reduced tensors (``Group.act`` with the parts' ``group_axes``) and the
result reduced the same way, so the comparison is exact for every layer type
and every :class:`~app.analysis.reductions.MapSelection`: an equivariant network shows
round-off (about 1e-6 relative in float32); a planar network shows how far it
is from equivariant.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from models import P4, Group, Network
from models.attention.parts import AttentionParts

from .composite import COMPOSITE_DESCRIPTION, paper_composite
from .frames import InputFrame
from .reductions import (
    MEANS,
    MapSelection,
    attention_layout,
    describe_reduction,
    reduce_attention,
    reduce_features,
    selectable,
    upsample,
)
from .transforms import apply_element

__all__ = ["LayerMaps", "Analysis", "analyse", "display_group", "moved_by_every_element", "proof_errors",
           "user_features"]

FEATURE_DESCRIPTION = "Response strength: mean over channels of |features| (before batch norm), per orientation."
PLANAR_FEATURE_DESCRIPTION = "Response strength: mean over channels of |features|; a planar layer has no orientations."


@dataclass(frozen=True)
class LayerMaps:
    """One layer's maps for every transform of the image, and the proof that they move with it.

    Attributes:
        name: the module's name in the network (e.g. ``"c2"``, ``"block_layers.0.conv"``).
        kind: ``"attention"``, ``"features"`` or ``"composite"`` (:attr:`Analysis.composite`).
        layout: attention layout (see :func:`app.analysis.reductions.attention_layout`),
            ``"group_features"``, ``"planar_features"`` or ``"composite"``.
        description: what the maps show, one sentence.
        maps: ``(T, H, X, Y)`` maps(g.x) for the T group elements, H orientations (1 if none).
        expected: ``(T, H, X, Y)`` g.maps(x): the identity's maps moved by g.
        max_abs_error: ``(T,)`` max |maps - expected| per element.
        relative_error: ``(T,)`` that divided by max |expected| of the element.
        channels: attention layers: how many channels a :class:`MapSelection` can pick
            (input channels of alpha_F layers, output channels of full ones); 0 for features.
        in_orientations: full group layers: how many input orientations it can pick; else 0.
        selection: the selection these maps were reduced with.
    """

    name: str
    kind: str
    layout: str
    description: str
    maps: np.ndarray
    expected: np.ndarray
    max_abs_error: np.ndarray
    relative_error: np.ndarray
    channels: int = 0
    in_orientations: int = 0
    selection: MapSelection = field(default=MEANS)
    _upsampled: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def difference(self) -> np.ndarray:
        """``(T, H, X, Y)`` maps(g.x) - g.maps(x)."""
        return self.maps - self.expected

    @property
    def orientations(self) -> int:
        return self.maps.shape[1]

    def upsampled(self, size: int, which: str = "maps") -> np.ndarray:
        """``maps``, ``expected`` or ``difference`` stretched over the ``size`` x ``size`` image.

        Bilinear, ``align_corners=False`` (see :func:`app.analysis.reductions.upsample`). Shape ``(T, H, size, size)``.
        Computed once per (size, which): the page draws the same layer in several places. Read-only.
        """
        key = (size, which)
        if key not in self._upsampled:
            values = getattr(self, which)
            result = upsample(torch.from_numpy(np.ascontiguousarray(values)), size).numpy()
            result.setflags(write=False)
            self._upsampled[key] = result
        return self._upsampled[key]


@dataclass(frozen=True)
class Analysis:
    """Everything the app shows for one model and one image.

    Attributes:
        group: name of the group whose elements were applied (``"p4"`` for planar models).
        equivariant: whether the model is a group network (planar ones are not).
        elements: the T element indices, identity first (p4m numbering).
        element_names: e.g. ``"rot 90°"``, ``"rot 0° + flip"``.
        images: ``(T, C, S, S)`` the transformed images g.x in [0, 1], user frame.
        probabilities: ``(T, classes)`` softmax of the logits of each g.x.
        class_names: one per class.
        attention: layer name -> :class:`LayerMaps` for every attentive layer, in forward order.
        features: layer name -> :class:`LayerMaps` for every convolution, in forward order.
        composite: the paper's composite picture (:func:`app.analysis.composite.paper_composite`, the product
            of every layer's alpha_s at the image size, one map per orientation) with its proof; None for a
            model without spatial attention or without a group.
    """

    group: str
    equivariant: bool
    elements: tuple[int, ...]
    element_names: tuple[str, ...]
    images: np.ndarray
    probabilities: np.ndarray
    class_names: tuple[str, ...]
    attention: dict[str, LayerMaps]
    features: dict[str, LayerMaps]
    composite: LayerMaps | None = None

    @property
    def probability_error(self) -> float:
        """Largest change of any class probability over the transforms (0 for an invariant model)."""
        return float(np.abs(self.probabilities - self.probabilities[:1]).max())

    def layer(self, name: str) -> LayerMaps:
        """The attention maps of ``name`` where it is attentive, else its features."""
        return self.attention.get(name) or self.features[name]


def display_group(model: Network) -> Group:
    """The group whose elements the app applies: the model's, or p4 for planar models."""
    return model.group or P4


def analyse(
    model: Network, card: dict, image: np.ndarray, element: int = 0,
    selections: Mapping[str, MapSelection] | None = None,
) -> Analysis:
    """Run the model once on every group transform of ``image`` and collect what the app shows.

    Args:
        model: a registered network in eval mode; it is not modified.
        card: its model card; ``card["input"]`` gives size, channels, mean, std and
            ``transposed``, and ``card.get("class_names")`` the labels.
        image: float ``(C, S, S)`` in [0, 1] in the user's frame, already fitted
            (:func:`app.analysis.images.fit_to_model`).
        element: a group element applied to the image first (the user's transform).
        selections: attention layer name -> which channel / input orientation to show;
            layers not named show means (:data:`app.analysis.reductions.MEANS`).

    Returns:
        An :class:`Analysis`; its transform t is element ``elements[t]`` applied to
        the (transformed) image.

    Raises:
        ValueError: a model in training mode, an image that does not fit the card, or a
            selection outside its layer's channels or orientations.
    """
    if model.training:
        raise ValueError("analyse needs a model in eval mode (dropout and batch statistics would change its maps)")
    spec = card["input"]
    expected_shape = (spec["channels"], spec["size"], spec["size"])
    if tuple(image.shape) != expected_shape:
        raise ValueError(f"the model takes images of shape {expected_shape}, got {tuple(image.shape)}")
    group = display_group(model)
    frame = InputFrame.from_card(card, model.group)
    elements = tuple(group.elements())
    base = apply_element(image.astype(np.float32), element)
    batch = np.stack([apply_element(base, g) for g in elements])  # (T, C, S, S)
    dtype = next(model.parameters()).dtype
    with torch.inference_mode():
        logits, trace = model.trace(frame.to_network(torch.from_numpy(batch).to(dtype)))
        probabilities = torch.softmax(logits.double(), dim=1).numpy()
        user = {name: frame.attention_to_user(parts) for name, parts in trace.attention.items()}
        attention = {
            name: _attention_maps(name, parts, group, (selections or {}).get(name, MEANS))
            for name, parts in user.items()
        }
        features = {name: _feature_maps(name, f, frame, group) for name, f in trace.features.items()}
        composite = _composite_maps(user, group, image.shape[-1]) if model.group is not None else None
    classes = probabilities.shape[1]
    class_names = tuple(card.get("class_names") or [str(i) for i in range(classes)])
    return Analysis(
        group=group.name,
        equivariant=model.group is not None,
        elements=elements,
        element_names=tuple(group.describe(g) for g in elements),
        images=batch,
        probabilities=probabilities,
        class_names=class_names,
        attention=attention,
        features=features,
        composite=composite,
    )


def _attention_maps(name: str, user: AttentionParts, group: Group, selection: MapSelection) -> LayerMaps:
    """``user``: the layer's parts in the user's frame."""
    axes = tuple(user.group_axes)
    # The identity's parts moved by every g (batch T), reduced in one call.
    moved = AttentionParts(*(None if t is None else moved_by_every_element(t[:1], group, axes)
                             for t in (user.channel, user.spatial)), group_axes=axes)
    maps = reduce_attention(user, selection)  # (T, H, X, Y)
    expected = reduce_attention(moved, selection)  # (T, H, X, Y)
    layout = attention_layout(user)
    channels, in_orientations = selectable(user)
    result = _layer_maps(name, "attention", layout, describe_reduction(layout, selection), maps, expected)
    return dataclasses.replace(result, channels=channels, in_orientations=in_orientations, selection=selection)


def _composite_maps(user: Mapping[str, AttentionParts], group: Group, size: int) -> LayerMaps | None:
    """The paper's composite of every transform, and the identity's moved by each g (an orientation axis: 1)."""
    maps = paper_composite(user, size, len(group.elements()))  # (T, G, S, S)
    if maps is None:
        return None
    expected = moved_by_every_element(maps[:1], group, (1,))
    return _layer_maps("composite", "composite", "composite", COMPOSITE_DESCRIPTION, maps, expected)


def user_features(features: torch.Tensor, frame: InputFrame) -> torch.Tensor:
    """A convolution's traced features as the page shows them: in the user's frame, reduced to one response
    strength map per orientation, ``(B, H, X, Y)`` (H = 1 for a planar layer)."""
    return reduce_features(frame.to_user(features, (2,) if features.dim() == 5 else ()))


def _feature_maps(name: str, features: torch.Tensor, frame: InputFrame, group: Group) -> LayerMaps:
    axes = (2,) if features.dim() == 5 else ()
    maps = user_features(features, frame)  # (T, H, X, Y)
    # g only moves entries (planes and the orientation axis), and the mean of |f| over channels sums the same
    # values in the same order wherever they are: moving the reduced map is exactly reducing the moved features,
    # at 1 / C of the cost.
    expected = moved_by_every_element(maps[:1], group, (1,) if axes else ())  # (T, H, X, Y)
    layout, text = ("group_features", FEATURE_DESCRIPTION) if axes else ("planar_features", PLANAR_FEATURE_DESCRIPTION)
    return _layer_maps(name, "features", layout, text, maps, expected)


def moved_by_every_element(t: torch.Tensor, group: Group, group_axes: tuple[int, ...] = ()) -> torch.Tensor:
    """``(1, ...)`` -> ``(T, ...)``: entry g is ``group.act(t, g, group_axes)``, for every element g, in one gather.

    Every element only moves entries, so its action is a fixed permutation of the
    flattened tensor; the permutations of a shape are found once (by acting on
    ``arange``) and cached, and moving a tensor by all of them is one indexing
    operation instead of one ``act`` per element and a concatenation. The
    result is exactly ``torch.cat([group.act(t, g, group_axes) for g in group.elements()])``.
    """
    index = _action_index(group, tuple(t.shape), tuple(group_axes))  # (T, N)
    return t.reshape(-1)[index].reshape(len(index), *t.shape[1:])


@functools.lru_cache(maxsize=128)
def _action_index(group: Group, shape: tuple[int, ...], group_axes: tuple[int, ...]) -> torch.Tensor:
    """``(T, N)``: where entry n of ``group.act(x, g, group_axes)`` comes from in ``x.reshape(-1)``, per element g."""
    probe = torch.arange(math.prod(shape)).reshape(shape)
    return torch.stack([group.act(probe, g, group_axes).reshape(-1) for g in group.elements()])


def _layer_maps(name, kind, layout, description, maps: torch.Tensor, expected: torch.Tensor) -> LayerMaps:
    """float32 maps, but attention in the kept reading stays float64
    (:func:`~app.analysis.reductions.reduce_attention`)."""
    dtype = torch.float64 if kind == "attention" and maps.dtype == torch.float64 else torch.float32
    maps, expected = maps.to(dtype).numpy(), expected.to(dtype).numpy()
    return LayerMaps(name, kind, layout, description, maps, expected, *proof_errors(maps, expected))


def proof_errors(maps: np.ndarray, expected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(T,)`` max |maps - expected| per element, and that over max |expected| (the error itself where that is 0);
    in the arrays' own precision."""
    diff = np.abs(maps - expected).reshape(len(maps), -1).max(axis=1)  # (T,)
    scale = np.abs(expected).reshape(len(maps), -1).max(axis=1)  # (T,)
    relative = np.where(scale > 0, diff / np.where(scale > 0, scale, 1), diff)
    return diff, relative
