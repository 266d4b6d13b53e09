"""relu(bn(cat(parts))) in one pass in inference equals PyTorch's three operations."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import models.cpu.relu_bn as relu_bn_module
from models import build_model
from models.cpu.relu_bn import relu_bn
from models.normalization import GroupBatchNorm

needs_kernels = pytest.mark.skipif(relu_bn_module.build_library(relu_bn_module.SOURCE) is None,
                                   reason="no C++ compiler here (or AAGC_NATIVE=0): the PyTorch path runs")


def eval_norm(norm: nn.Module, dtype=torch.float64) -> nn.Module:
    """A batch norm in eval mode with running statistics and affine parameters far from their defaults."""
    norm = norm.to(dtype)
    with torch.no_grad():
        norm.running_mean.uniform_(-1, 1)
        norm.running_var.uniform_(0.3, 3)
        if norm.affine:
            norm.weight.uniform_(-1, 2)
            norm.bias.uniform_(-1, 1)
    return norm.eval()


def reference(norm, parts):
    return torch.relu(norm(torch.cat(parts, dim=1)))


@needs_kernels
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("layout", ["group, block and cropped input", "group, one part", "planar, two parts"])
def test_one_pass_equals_concatenation_batch_norm_and_relu(layout, affine):
    torch.manual_seed(0)
    if layout.startswith("group"):
        x = torch.randn(3, 4, 8, 12, 14, dtype=torch.float64)
        parts = (torch.randn(3, 3, 8, 10, 12, dtype=torch.float64), x[..., 1:-1, 1:-1])
        if layout == "group, one part":
            parts = (x,)
        norm = eval_norm(GroupBatchNorm(sum(p.shape[1] for p in parts), affine=affine))
    else:
        parts = (torch.randn(2, 5, 9, 11, dtype=torch.float64), torch.randn(2, 2, 9, 11, dtype=torch.float64))
        norm = eval_norm(nn.BatchNorm2d(7, affine=affine))
    parts[0][0, 0, ..., 0] = float("nan")  # NaN passes through as in torch.relu
    with torch.no_grad():
        assert relu_bn_module._fused(norm, parts)
        got, want = relu_bn(norm, parts), reference(norm, parts)
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13, equal_nan=True)
    assert got.is_contiguous()


@pytest.mark.parametrize("case", ["training", "gradient", "bfloat16", "no compiler"])
def test_pytorch_path_where_the_loop_does_not_apply(case, monkeypatch):
    if case == "no compiler":  # as in the Docker image
        monkeypatch.setattr(relu_bn_module, "build_library", lambda source: None)
    torch.manual_seed(1)
    dtype = torch.bfloat16 if case == "bfloat16" else torch.float64
    norm = eval_norm(GroupBatchNorm(5), dtype)
    parts = (torch.randn(2, 2, 4, 6, 6, dtype=dtype), torch.randn(2, 3, 4, 6, 6, dtype=dtype))
    if case == "training":
        norm.train()
    if case == "gradient":
        parts[0].requires_grad_()
    assert not relu_bn_module._fused(norm, parts)
    got = relu_bn(norm, parts)
    torch.testing.assert_close(got, reference(norm, parts))
    if case == "gradient":
        got.sum().backward()
        assert parts[0].grad is not None


@needs_kernels
@pytest.mark.parametrize("name", ["fa_p4m_densenet", "p4m_densenet", "densenet"])
def test_densenet_logits_equal_the_pytorch_path(name, monkeypatch):
    torch.manual_seed(2)
    model = build_model(name).double().eval()
    for norm in model.modules():
        if isinstance(norm, nn.modules.batchnorm._BatchNorm):
            eval_norm(norm)
    x = torch.randn(2, 3, 96, 96, dtype=torch.float64)
    fused = []
    real = relu_bn_module._fused
    monkeypatch.setattr(relu_bn_module, "_fused", lambda norm, parts: fused.append(real(norm, parts)) or fused[-1])
    with torch.no_grad():
        ours = model(x)
        assert fused and all(fused), "the DenseNet did not take the one-pass loop"
        monkeypatch.setattr(relu_bn_module, "_fused", lambda norm, parts: False)
        theirs = model(x)
    # Round-off in float64, grown through a random network (logits in the thousands): 1e-12 of them.
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10 * theirs.abs().max().item())
