"""An attentive network warm-started from its plain counterpart computes the plain network's function exactly."""

from __future__ import annotations

import pytest
import torch

from models import build_model
from models.warm_start import attentive_from_plain

# attentive model -> its plain counterpart (the same weights without the attention modules)
PAIRS = {"fa_p4cnn": "p4cnn", "a_p4cnn": "p4cnn", "ach_p4cnn": "p4cnn", "asp_p4cnn": "p4cnn",
         "arh_p4cnn": "p4cnn", "fa_p4m_densenet": "p4m_densenet"}


def trained_like(name: str) -> torch.nn.Module:
    """A float64 network in eval mode whose BatchNorm statistics are not the identity."""
    torch.manual_seed(1)
    model = build_model(name).double()
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.running_mean.uniform_(-0.3, 0.3)
            module.running_var.uniform_(0.5, 2.0)
            module.weight.data.uniform_(0.5, 1.5)
            module.bias.data.uniform_(-0.2, 0.2)
    return model.eval()


@pytest.mark.parametrize("attentive, plain", PAIRS.items())
def test_warm_started_attentive_network_equals_the_plain_one(attentive, plain):
    source = trained_like(plain)
    model = build_model(attentive).double().eval()
    attentive_from_plain(model, source.state_dict(), f"a {plain}")
    size = 96 if "densenet" in plain else 28
    x = torch.randn(2, 3 if "densenet" in plain else 1, size, size, dtype=torch.float64)
    with torch.no_grad():
        expected, got = source(x), model(x)
    assert torch.allclose(got, expected, rtol=1e-10, atol=1e-12), (
        f"warm-started {attentive} differs from {plain} by {(got - expected).abs().max():.3g}")
    _, trace = model.trace(x)
    for name, parts in trace.attention.items():
        both = parts.channel is not None and parts.spatial is not None
        assert torch.all(parts.effective() == (0.75 if both else 0.5)), f"{name}: the attention starts constant"


def test_gradients_reach_every_attention_weight():
    # Seeded: a two-unit ReLU MLP can start dead on some inputs whatever its second layer (a property of alpha_F's
    # channel attention, not of the warm start); this seed starts none dead.
    torch.manual_seed(0)
    model = build_model("fa_p4m_densenet")
    attentive_from_plain(model, build_model("p4m_densenet").state_dict(), "a p4m_densenet")
    model(torch.randn(2, 3, 96, 96)).logsumexp(1).sum().backward()
    for name, parameter in model.named_parameters():
        if "channel_attention.weight_fc2" in name or "spatial_attention" in name:
            assert parameter.grad.abs().max() > 0, f"{name} gets no gradient"


def test_weights_of_another_architecture_are_refused():
    message = r"a densenet is not the plain counterpart of this network: different shape: block_layers.0.bn.bias"
    with pytest.raises(ValueError, match=message):
        attentive_from_plain(build_model("fa_p4m_densenet"), build_model("densenet").state_dict(), "a densenet")
