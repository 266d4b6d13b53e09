"""benchmarks.densenet_profile times every top-level layer of a DenseNet, forward and backward."""

from __future__ import annotations

import torch

from benchmarks.densenet_profile import layer_times, top_layers
from models import build_model


def test_every_layer_gets_its_forward_and_backward_time():
    # The dense blocks hand their parts (not a tensor) to the next layer: the hooks must follow them.
    torch.manual_seed(0)
    model = build_model("densenet")
    x = torch.randn(2, 3, 96, 96)

    def step():
        torch.nn.functional.cross_entropy(model(x), torch.tensor([0, 1])).backward()

    times = layer_times(model, step)
    assert list(times) == [name for name, _ in top_layers(model)]
    for name, spent in times.items():
        assert spent["forward"] > 0, name
        # c1's input, the image, wants no gradient, so its backward is not timed.
        assert (spent["backward"] is None) == (name == "c1"), name
