"""Grad-CAM (Selvaraju et al., ICCV 2017) for the planar networks of this library, in torch autograd.

For an image, a class c and the features A that a convolution reads (K channels, ``h x w``):

    w_k = mean over (i, j) of d logit_c / d A_k[i, j]     (one weight per channel)
    map = ReLU(sum_k w_k A_k)                              (``h x w``, then bilinear over the image)

A is the *input* of the named convolution: the activations the network actually
passes on (after batch norm, ReLU and any pooling), the rectified feature maps
the paper uses. For Z2CNN the default is c7, the classifier that turns the
4 x 4 output of c6 (after batch norm and ReLU) into the 1 x 1 logits. A
convolution's own output (what :class:`~models.network.Trace` records, before batch
norm) would not do: batch norm adds a per-channel offset b_k after it, so
sum_k w_k A_k misses a constant sum_k w_k b_k / a_k and the ReLU then cuts the
map at an arbitrary level (on gallery digit 0 with the shipped Z2CNN it cuts
away the whole map).

The map is the paper's, unnormalised: its values are in units of logit, so maps
of one model and one class compare by value.

Grad-CAM needs a gradient, so this is the one place of the app that runs a model
outside ``torch.inference_mode()``. It reads the model only: it must be in eval
mode (batch norm with running statistics, no dropout), its parameters are not
changed, and ``torch.autograd.grad`` is asked for the gradient with respect to A
alone, so no ``.grad`` is left on any parameter. The inputs are recorded by a
:class:`~models.network.Trace` made for the call, not by hooks, so concurrent
callers of a shared model do not see each other.

Group networks are refused: their attention maps already say where they look,
and :mod:`app.analysis.compute` proves those maps move with the image.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from models import Network
from models.network import Trace

from .frames import InputFrame
from .reductions import upsample

__all__ = ["GradCam", "grad_cam", "image_grad_cam", "default_layer"]


@dataclass(frozen=True)
class GradCam:
    """Grad-CAM of a batch of images.

    Attributes:
        layer: the convolution whose input A the maps explain.
        classes: ``(B,)`` the class each map explains.
        probabilities: ``(B, classes)`` softmax of the logits.
        coarse: ``(B, h, w)`` the maps at A's resolution, >= 0.
        maps: ``(B, S, S)`` the maps stretched over the image (bilinear), >= 0.
    """

    layer: str
    classes: np.ndarray
    probabilities: np.ndarray
    coarse: np.ndarray
    maps: np.ndarray


@dataclass
class _InputTrace(Trace):
    """A :class:`Trace` that also keeps what every convolution reads, by the convolution's name."""

    inputs: dict[str, torch.Tensor] = field(default_factory=dict)

    def run(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        self.inputs[self.names[layer]] = x
        return super().run(layer, x)


def default_layer(inputs: Mapping[str, torch.Tensor]) -> str:
    """The last convolution whose input is larger than 1 x 1, from ``{name: input}`` in forward order.

    Grad-CAM explains the last features that still form a spatial grid: after them
    there is no "where" left. In Z2CNN that is c7's input, the 4 x 4 output of c6
    after batch norm and ReLU (c7 itself outputs the 1 x 1 logits; a map on a 1 x 1
    grid would be one constant per image).

    Raises:
        ValueError: no convolution reads more than one position.
    """
    spatial = [name for name, x in inputs.items() if x.shape[-2] * x.shape[-1] > 1]
    if not spatial:
        raise ValueError("no convolution of this network reads more than 1 x 1 positions: no map to show")
    return spatial[-1]


def grad_cam(
    model: Network, x: torch.Tensor, layer: str | None = None, target: int | Sequence[int] | None = None,
    size: int | None = None,
) -> GradCam:
    """Grad-CAM of a planar network for images as the network takes them.

    Args:
        model: a planar registered network (``model.group is None``) in eval mode; only read.
        x: ``(B, C, X, Y)`` network input (normalised, in the network's frame).
        layer: name of a convolution (e.g. ``"c7"``); the maps explain its input.
            None: :func:`default_layer`.
        target: the class to explain: one for every image, one per image, or None for each
            image's predicted class.
        size: side of the upsampled maps; None: ``X`` (the input's).

    Returns:
        A :class:`GradCam` in the network's frame.

    Raises:
        ValueError: a group network, a model in training mode, an unknown layer, a layer whose
            input is not ``(B, K, h, w)``, or a target outside the classes.
    """
    if model.group is not None:
        raise ValueError(f"Grad-CAM here is for planar networks; {model.arch or type(model).__name__} is a "
                         f"{model.group.name} network: show its attention maps instead")
    if model.training:
        raise ValueError("grad_cam needs a model in eval mode (dropout and batch statistics would change its maps)")
    if x.dim() != 4:
        raise ValueError(f"images must be (B, C, X, Y), got shape {tuple(x.shape)}")
    dtype = next(model.parameters()).dtype
    # inference_mode(False): callers may sit in inference mode, where no graph is built.
    with torch.inference_mode(False), torch.enable_grad():
        # A fresh leaf that requires grad: a graph up to A exists even if the parameters are frozen.
        x = x.detach().to(dtype).clone().requires_grad_(True)
        # Network.trace with a trace that also records inputs (the same forward pass; nothing touches the module).
        trace = _InputTrace({module: name for name, module in model.named_modules()})
        logits = model._forward(x, trace)  # (B, classes)
        name = default_layer(trace.inputs) if layer is None else layer
        if name not in trace.inputs:
            raise ValueError(f"unknown layer {name!r}; the convolutions of this network are "
                             f"{', '.join(trace.inputs)}")
        activations = trace.inputs[name]  # (B, K, h, w)
        if activations.dim() != 4:
            raise ValueError(f"layer {name!r} reads shape {tuple(activations.shape)}, not (B, K, h, w)")
        classes = _classes(logits, target)  # (B,)
        # In eval mode the images of a batch do not interact, so the gradient of the sum of each image's own
        # class score with respect to A holds, in each image's slice, exactly that image's d logit_c / d A.
        score = logits.gather(1, classes[:, None]).sum()
        (gradients,) = torch.autograd.grad(score, activations)  # (B, K, h, w); no parameter's .grad is touched
    weights = gradients.mean(dim=(-2, -1), keepdim=True)  # (B, K, 1, 1)
    coarse = torch.relu((weights * activations.detach()).sum(dim=1))  # (B, h, w)
    maps = upsample(coarse[:, None], size or x.shape[-1])[:, 0]  # (B, S, S)
    return GradCam(
        layer=name,
        classes=classes.numpy(),
        probabilities=torch.softmax(logits.detach().double(), dim=1).numpy(),
        coarse=coarse.numpy(),
        maps=maps.numpy(),
    )


def _classes(logits: torch.Tensor, target: int | Sequence[int] | None) -> torch.Tensor:
    batch, count = logits.shape
    if target is None:
        return logits.detach().argmax(dim=1)
    if np.ndim(target) == 0:
        classes = torch.full((batch,), int(target), dtype=torch.long)
    else:
        classes = torch.as_tensor(list(target), dtype=torch.long)
    if classes.shape != (batch,):
        raise ValueError(f"give one target class, or one per image ({batch}), got {len(classes)}")
    if not bool(((classes >= 0) & (classes < count)).all()):
        raise ValueError(f"target classes must be in [0, {count}), got {classes.tolist()}")
    return classes


def image_grad_cam(
    model: Network, card: dict, images: np.ndarray, layer: str | None = None,
    target: int | Sequence[int] | None = None,
) -> GradCam:
    """Grad-CAM of images in the app's terms: pixels in [0, 1] in the user's frame, maps back in that frame.

    The images are normalised (and transposed) as ``card["input"]`` says
    (:class:`~app.analysis.frames.InputFrame`); the maps come back through the inverse,
    so they lie on the images as the user sees them.

    Args:
        model: a planar registered network in eval mode.
        card: its model card.
        images: float ``(B, C, S, S)`` in [0, 1], or one ``(C, S, S)`` image (then B = 1).
        layer, target: as :func:`grad_cam`.

    Returns:
        A :class:`GradCam` whose ``coarse`` and ``maps`` are in the user's frame, ``maps`` ``(B, S, S)``.

    Raises:
        ValueError: as :func:`grad_cam`, or images that do not fit the card.
    """
    images = np.asarray(images, dtype=np.float32)
    if images.ndim == 3:
        images = images[None]
    spec = card["input"]
    expected = (spec["channels"], spec["size"], spec["size"])
    if images.ndim != 4 or tuple(images.shape[1:]) != expected:
        raise ValueError(f"the model takes images of shape {expected}, got {tuple(images.shape)}")
    frame = InputFrame.from_card(card, None)
    result = grad_cam(model, frame.to_network(torch.from_numpy(images)), layer, target)
    coarse, maps = (frame.to_user(torch.from_numpy(m)).numpy() for m in (result.coarse, result.maps))
    return GradCam(result.layer, result.classes, result.probabilities, coarse, maps)
