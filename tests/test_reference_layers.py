"""Single layers, built as the architectures build them (``LayerFactory``), against the paper's code, float64:
``layers_synthetic.npz`` to 1e-10."""

import pytest
import torch

from models.architectures.layer_factory import LayerFactory
from models.gconv import group_filters, lifting_filters
from models.groups import P4M

TOL = 1e-10

# The reference's layers by its class names (se2: p4, e2: p4m; f: alpha_F, RomHog: alpha_RH), each the factory's
# layer of that variant with the reference's channels and attention reductions.
LAYERS = {
    "se2_ConvRnG": lambda: LayerFactory("p4").lift(3, 4, 3, padding=1),
    "se2_ConvGG": lambda: LayerFactory("p4").conv(3, 4, 3, padding=1),
    "e2_ConvRnG": lambda: LayerFactory("p4m").lift(3, 4, 3, padding=1),
    "e2_ConvGG": lambda: LayerFactory("p4m").conv(3, 4, 3, padding=1),
    "se2_fAttConvRnG": lambda: LayerFactory("p4", "input").lift(3, 4, 3, padding=1, reduction=1),
    "se2_fAttConvGG": lambda: LayerFactory("p4", "input").conv(4, 4, 3, padding=1, reduction=2),
    "e2_fAttConvRnG": lambda: LayerFactory("p4m", "input").lift(3, 4, 3, padding=1, reduction=1),
    "e2_fAttConvGG": lambda: LayerFactory("p4m", "input").conv(4, 4, 3, padding=1, reduction=2),
    "se2_AttConvRnG": lambda: LayerFactory("p4", "full").lift(3, 4, 3, padding=1, reduction=1),
    "se2_AttConvGG": lambda: LayerFactory("p4", "full").conv(4, 4, 3, padding=1, reduction=2),
    "se2_RomHog_fAttConvGG": lambda: LayerFactory("p4", "rotation").conv(4, 4, 3, padding=1),
}


def arrays(data, key):
    return {name: torch.from_numpy(data[name]) for name in data.files if name.startswith(key + "__")}


@pytest.mark.parametrize("key", sorted(LAYERS))
def test_layer_matches_paper_code(key, layers_synthetic):
    ref = arrays(layers_synthetic, key)
    layer = LAYERS[key]().double().eval()
    prefix = f"{key}__param__"
    layer.load_state_dict({k[len(prefix):]: v for k, v in ref.items() if k.startswith(prefix)}, strict=True)
    x = ref[f"{key}__input"]
    with torch.no_grad():
        if hasattr(layer, "attend"):
            out, parts = layer(x, return_attention=True)
        else:
            out, parts = layer(x), None
    assert (out - ref[f"{key}__output"]).abs().max() <= TOL, "layer output"
    filters = lifting_filters if layer.weight.dim() == 4 else group_filters
    assert torch.equal(filters(layer.weight, layer.group).transpose(0, 1), ref[f"{key}__kernel_stack"])
    for label in ("channel", "spatial"):
        name = f"{key}__{label}_attention_map"
        if name in ref:
            assert (getattr(parts, label) - ref[name]).abs().max() <= TOL, f"{label} attention map"


def test_group_grids_match(layers_synthetic):
    grid = layers_synthetic["grid_p4m"]  # (theta, m) per element
    for g in P4M.elements():
        k, mirrored = P4M.parts(g)
        assert abs(grid[g, 0] - k * torch.pi / 2) < 1e-6 and grid[g, 1] == (-1 if mirrored else 1)
