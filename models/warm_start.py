"""An attentive network started from its trained plain counterpart, computing exactly the same function.

Every attentive layer multiplies what it attends to by ``1 - alpha_c * alpha_s`` (the residual attention branch;
a missing part counts as 1), each part a sigmoid of a last linear map without bias: the channel attention's
``weight_fc2`` and the spatial attention's ``weight``. With those set to zero each part is sigmoid(0) = 1/2
everywhere, so the multiplier is the constant ``1 - 1/4`` (both parts) or ``1 - 1/2`` (one part). The layer's
convolution is linear in what it attends to, so dividing its weight by that constant gives back the plain
layer's output exactly (a bias, added after, is unchanged). The attention then starts as the identity and
learns from there: the channel MLP's first layer keeps its random weights, so that ``weight_fc2``'s gradient
is not zero (both zero would stay zero).
"""

from __future__ import annotations

import torch
from torch import nn

from .attention.parts import AttentiveLayer

__all__ = ["attentive_from_plain", "LAST_ATTENTION_WEIGHTS"]

# The last linear map of each attention part, whose zero makes the part's sigmoid 1/2.
LAST_ATTENTION_WEIGHTS = {"channel_attention": "weight_fc2", "spatial_attention": "weight"}


def attentive_from_plain(attentive: nn.Module, plain_state: dict[str, torch.Tensor], source: str) -> None:
    """Load a plain network's weights into its attentive counterpart so that both compute the same function.

    Args:
        attentive: the attentive network, changed in place.
        plain_state: ``state_dict()`` of the plain network (the same names without the attention modules).
        source: where the weights came from, for error messages.

    Raises:
        ValueError: the plain weights do not fit: a name missing on either side or a shape that differs.
    """
    own = attentive.state_dict()
    attention_names = {name for name in own if any(f".{part}." in f".{name}" for part in LAST_ATTENTION_WEIGHTS)}
    expected = set(own) - attention_names
    missing, unexpected = sorted(expected - set(plain_state)), sorted(set(plain_state) - expected)
    wrong = sorted(k for k in expected & set(plain_state) if plain_state[k].shape != own[k].shape)
    if missing or unexpected or wrong:
        raise ValueError(f"{source} is not the plain counterpart of this network: "
                         + "; ".join(f"{what}: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}"
                                     for what, names in (("missing", missing), ("unexpected", unexpected),
                                                         ("different shape", wrong)) if names))
    attentive.load_state_dict({**own, **plain_state}, strict=True)
    with torch.no_grad():
        for layer in attentive.modules():
            if not isinstance(layer, AttentiveLayer):
                continue
            suppressed = 1.0  # the product of the parts present, each 1/2 once zeroed
            for part, weight in LAST_ATTENTION_WEIGHTS.items():
                module = getattr(layer, part)
                if module is not None:
                    getattr(module, weight).zero_()
                    suppressed *= 0.5
            layer.weight.div_(1.0 - suppressed)
