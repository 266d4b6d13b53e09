"""The networks' bfloat16 path (models/cpu/bfloat16_kernels.py, the layers' bfloat16 branches) against float32 on
real H&E patches: each kernel against its float32 self, each attentive layer of a shipped model, the whole network
(P(tumour) and the first layer's attention), the fallback where the kernels are missing, and its own equivariance
error, measured and small, not claimed exact.

Kept small (a few 96 x 96 patches): on an AVX2-only CPU bfloat16 is emulated and the kernels run their plain loops.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from app.analysis.frames import InputFrame
from models import load_checkpoint
from models.attention.input_attentive_conv import InputAttentiveGroupConv, _bfloat16_attend
from models.attention.parts import AttentiveLayer
from models.cpu import bfloat16_kernels
from models.cpu.relu_bn import relu_bn

REPO = Path(__file__).resolve().parents[1]
GALLERY = sorted((REPO / "app" / "gallery").glob("pcam_*.jpg"))  # 12 real PCam patches, 6 tumour, 6 normal
SHIPPED = REPO / "checkpoints"

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None,
                                reason="no C++ compiler here to build the bfloat16 kernels")

# One bfloat16 rounding: 8 bits of mantissa, half a unit in the last place relative.
ROUNDING = 2.0 ** -8


@pytest.fixture(scope="module")
def pcam():
    model, card = load_checkpoint(SHIPPED / "fa_p4m_densenet_pcam.safetensors")
    return model, card


def patches(card: dict, group, count: int = 12) -> torch.Tensor:
    images = np.stack([np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255 for path in GALLERY])
    x = torch.from_numpy(images[:count]).permute(0, 3, 1, 2).contiguous()  # (B, 3, 96, 96) in [0, 1]
    return InputFrame.from_card(card, group).to_network(x)


def probabilities(model, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return torch.softmax(model(x).float(), dim=1)[:, 1]


def layer_inputs(model, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The bfloat16 network's input to every attentive layer on ``x`` (what the layer attends to)."""
    seen, hooks = {}, []
    for name, module in model.named_modules():
        if hasattr(module, "channel_attention"):
            hooks.append(module.register_forward_pre_hook(lambda m, args, name=name: seen.setdefault(name, args[0])))
    try:
        with torch.inference_mode():
            model(x.bfloat16())
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def test_kernels_build_here():
    assert bfloat16_kernels.available(), "the bfloat16 kernels did not build on this machine"


def test_relu_bn_equals_float32_rounded_once(pcam):
    """relu(bn(cat(new channels, cropped input))) on the real bfloat16 outputs of the first two convolutions: the
    float32 result of the same inputs rounded once."""
    model, card = pcam
    outputs = {}
    hooks = [model.get_submodule(name).register_forward_hook(lambda m, a, out, name=name: outputs.update({name: out}))
             for name in ("c1", "block_layers.0.conv")]
    try:
        with torch.inference_mode():
            model(patches(card, model.group, 4).bfloat16())
    finally:
        for hook in hooks:
            hook.remove()
    first, new = outputs["c1"], outputs["block_layers.0.conv"]
    for bn, parts in ((model.block_layers[0].bn, (first,)), (model.trans_layers[0].bn, (new, first[..., 1:-1, 1:-1]))):
        with torch.inference_mode():
            out = relu_bn(bn, parts)
            expected = torch.relu(bn(torch.cat([p.float() for p in parts], dim=1)))
        assert out.dtype == torch.bfloat16 and bfloat16_kernels.is_channels_last(out)
        torch.testing.assert_close(out.float(), expected, rtol=ROUNDING, atol=1e-5)


@pytest.mark.parametrize("checkpoint", ["fa_p4m_densenet_pcam", "fa_p4_densenet_pcam"])
def test_every_attentive_layer_against_float32(checkpoint):
    """Each alpha_F layer of a shipped model on its real bfloat16 input: the attended map against float32's
    attention of the same input, and both parts (alpha_s from statistics rounded to bfloat16 on AMX)."""
    model, card = load_checkpoint(SHIPPED / f"{checkpoint}.safetensors")
    inputs = layer_inputs(model, patches(card, model.group, 3))
    assert len(inputs) == 11
    for name, f in inputs.items():
        layer = model.get_submodule(name)
        with torch.inference_mode():
            out, parts = _bfloat16_attend(layer, f)
            expected, reference = AttentiveLayer.attend(layer, f.float())  # PyTorch's float32 path
        scale = expected.abs().amax()
        assert (out.float() - expected).abs().max() <= 4 * ROUNDING * scale, name
        torch.testing.assert_close(parts.channel, reference.channel, rtol=1e-4, atol=1e-5, msg=name)
        torch.testing.assert_close(parts.spatial, reference.spatial, rtol=0, atol=0.01, msg=name)


@pytest.mark.parametrize("checkpoint", ["fa_p4m_densenet_pcam", "fa_p4_densenet_pcam", "p4m_densenet_pcam"])
def test_whole_network_against_float32(checkpoint):
    """P(tumour) of the 12 gallery patches within 0.02 of float32's (the same calls at 0.5 where float32's is
    further than that from it), float32 logits, and the first layer's alpha_s ranked alike (Spearman over each
    patch's pixels)."""
    model, card = load_checkpoint(SHIPPED / f"{checkpoint}.safetensors")
    x = patches(card, model.group)
    p32, p16 = probabilities(model, x), probabilities(model, x.bfloat16())
    assert (p16 - p32).abs().max() <= 0.02
    clear = (p32 - 0.5).abs() > 0.02
    assert torch.equal((p16 > 0.5)[clear], (p32 > 0.5)[clear])
    with torch.inference_mode():
        assert model(x[:1].bfloat16()).dtype == torch.float32
    if checkpoint.startswith("fa_"):
        with torch.inference_mode():
            _, trace32 = model.trace(x, record=("c1",))
            _, trace16 = model.trace(x.bfloat16(), record=("c1",))
        for a, b in zip(trace32.attention["c1"].spatial, trace16.attention["c1"].spatial, strict=True):
            ranks = [np.argsort(np.argsort(m.flatten().numpy())) for m in (a, b.float())]
            assert np.corrcoef(*ranks)[0, 1] >= 0.99


def test_one_image_stays_channels_last(pcam):
    """With one image the strides alone leave oneDNN free to write NCHW; every layer must stay on the kernels."""
    model, card = pcam
    x = patches(card, model.group, 1).bfloat16()
    outputs = []
    hooks = [module.register_forward_hook(lambda m, args, out: outputs.append(out))
             for module in model.modules() if isinstance(module, InputAttentiveGroupConv)]
    try:
        with torch.inference_mode():
            model(x)
    finally:
        for hook in hooks:
            hook.remove()
    assert outputs and all(bfloat16_kernels.is_channels_last(out) for out in outputs)


def test_without_the_kernels_bfloat16_still_runs(pcam, monkeypatch):
    """Where the kernels cannot be built, a bfloat16 input still gives the model's answer (attended in float32)."""
    model, card = pcam
    x = patches(card, model.group, 4)
    expected = probabilities(model, x.bfloat16())
    monkeypatch.setattr(bfloat16_kernels, "available", lambda: False)
    assert (probabilities(model, x.bfloat16()) - expected).abs().max() <= 0.02


def test_avx512_loop_equals_the_tiles(pcam, monkeypatch):
    """The spatial filter's two kernels (AMX tiles from bfloat16 statistics, the float32 loop) agree."""
    if not bfloat16_kernels.tiles():
        pytest.skip("no AMX here: only the float32 loop runs")
    model, card = pcam
    f = layer_inputs(model, patches(card, model.group, 2))["block_layers.0.conv"]
    layer = model.block_layers[0].conv
    with torch.inference_mode():
        _, tiles = _bfloat16_attend(layer, f)
        monkeypatch.setenv("AAGC_AMX", "0")
        _, loop = _bfloat16_attend(layer, f)
    torch.testing.assert_close(tiles.spatial, loop.spatial, rtol=0, atol=5e-3)


def test_bfloat16_equivariance_error_is_measured_small(pcam):
    """bfloat16 is not exactly equivariant (sums in other orders round otherwise): its error under a quarter turn
    and a mirror of the input, in P(tumour), is small; float32's is at round-off."""
    model, card = pcam
    x = patches(card, model.group, 4)
    for move in (lambda t: torch.rot90(t, 1, dims=(-2, -1)), lambda t: torch.flip(t, dims=(-1,))):
        p32 = probabilities(model, x), probabilities(model, move(x))
        p16 = probabilities(model, x.bfloat16()), probabilities(model, move(x).bfloat16())
        assert (p32[0] - p32[1]).abs().max() <= 1e-5
        assert (p16[0] - p16[1]).abs().max() <= 0.02
