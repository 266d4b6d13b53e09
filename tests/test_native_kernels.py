"""The compiled attention kernels against the same quantities built from f~ with PyTorch ops.

f~ is materialised here with a depthwise convolution, as in the straightforward
attentive layers; the kernels never store it.
"""

import os
import shutil
import warnings

import pytest
import torch
import torch.nn.functional as F

from models.attention import native

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "g++")) is None, reason="no C++ compiler here to build the attention kernels"
)

# (B, C, H, size, k, stride, dilation, padding, Q): Q below, at and above one vector block (16)
GEOMETRIES = [
    (3, 5, 4, 9, 3, 1, 1, 1, 40),
    (2, 3, 1, 10, 3, 2, 1, 0, 12),
    (2, 4, 8, 11, 5, 1, 2, 4, 16),
    (1, 2, 4, 6, 4, 1, 1, 0, 17),
]
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5}


def unsummed(padded, kernels, h, stride, dilation):
    """f~ ``(B, Q, C, H, X', Y')`` from padded planes ``(B, C * H, Xp, Yp)`` and filters ``(Q, C, H, k * k)``."""
    q, c, k = kernels.shape[0], kernels.shape[1], round(kernels.shape[-1] ** 0.5)
    depthwise = kernels.permute(1, 2, 0, 3).reshape(c * h * q, 1, k, k)
    f = F.conv2d(padded, depthwise, stride=stride, dilation=dilation, groups=c * h)
    return f.view(padded.shape[0], c, h, q, *f.shape[-2:]).permute(0, 3, 1, 2, 4, 5)


def inputs(geometry, dtype):
    b, c, h, size, k, stride, dilation, padding, q = geometry
    generator = torch.Generator().manual_seed(0)
    planes = torch.relu(torch.randn(b, c * h, size, size, dtype=dtype, generator=generator))
    planes[..., : size // 2, :] = 0  # zero regions: f~ ties at 0 over channels and positions
    padded = F.pad(planes, (padding,) * 4)
    kernels = torch.randn(q, c, h, k * k, dtype=dtype, generator=generator)
    alpha = torch.rand(b, q, c, h, dtype=dtype, generator=generator)
    return padded, kernels, alpha


def relative(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
def test_spatial_max_is_the_first_maximum_with_gradients(geometry, dtype):
    padded, kernels, _ = inputs(geometry, dtype)
    h, stride, dilation, q = geometry[2], geometry[5], geometry[6], geometry[8]
    leaves = [t.clone().requires_grad_() for t in (padded, kernels)]
    size = unsummed(padded, kernels, h, stride, dilation).shape[-2:]
    value, where = native.spatial_max(leaves[0], leaves[1].reshape(q, -1, kernels.shape[-1]), h, size, stride,
                                      dilation)

    oracle = [t.clone().requires_grad_() for t in (padded, kernels)]
    expected = unsummed(*oracle, h, stride, dilation).flatten(-2).max(dim=-1)  # torch.max: the first maximum
    # (B, Q, C, H) -> (B, C * H, Q)
    expected_value, expected_where = (t.permute(0, 2, 3, 1).reshape(where.shape) for t in expected)
    assert torch.equal(where, expected_where)
    assert relative(value, expected_value) <= TOLERANCE[dtype]

    upstream = torch.randn(value.shape, dtype=dtype, generator=torch.Generator().manual_seed(1))
    (value * upstream).sum().backward()
    (expected_value * upstream).sum().backward()
    for name, mine, theirs in zip(("planes", "kernels"), leaves, oracle, strict=True):
        assert relative(mine.grad, theirs.grad) <= TOLERANCE[dtype], f"gradient of {name}"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
def test_attended_sum_and_max_with_gradients(geometry, dtype):
    padded, kernels, alpha = inputs(geometry, dtype)
    h, stride, dilation = geometry[2], geometry[5], geometry[6]
    leaves = [t.clone().requires_grad_() for t in (padded, kernels, alpha)]
    total, peak = native.attended_max(*leaves, h, unsummed(padded, kernels, h, stride, dilation).shape[-2:], stride,
                                      dilation)

    oracle = [t.clone().requires_grad_() for t in (padded, kernels, alpha)]
    attended = oracle[2][..., None, None] * unsummed(oracle[0], oracle[1], h, stride, dilation)  # (B, Q, C, H, X', Y')
    # channels last: (B, X', Y', H, Q)
    expected_total = attended.sum(dim=2).permute(0, 3, 4, 2, 1)
    expected_peak = attended.max(dim=2).values.permute(0, 3, 4, 2, 1)
    tol = TOLERANCE[dtype]
    assert total.shape == expected_total.shape and relative(total, expected_total) <= tol
    assert relative(peak, expected_peak) <= tol

    generator = torch.Generator().manual_seed(1)
    upstream = [torch.randn(total.shape, dtype=dtype, generator=generator) for _ in range(2)]
    (total * upstream[0] + peak * upstream[1]).sum().backward()
    (expected_total * upstream[0] + expected_peak * upstream[1]).sum().backward()
    for name, mine, theirs in zip(("planes", "kernels", "alpha"), leaves, oracle, strict=True):
        assert relative(mine.grad, theirs.grad) <= tol, f"gradient of {name}"


def test_one_output_without_gradient():
    # Only the max used downstream: the sum's gradient is None in backward.
    padded, kernels, alpha = inputs(GEOMETRIES[0], torch.float64)
    kernels.requires_grad_()
    _, peak = native.attended_max(padded, kernels, alpha, 4, (9, 9), 1, 1)
    peak.sum().backward()
    assert kernels.grad is not None and torch.isfinite(kernels.grad).all()


def test_without_channel_attention():
    padded, kernels, _ = inputs(GEOMETRIES[0], torch.float64)
    leaves = [t.clone().requires_grad_() for t in (padded, kernels)]
    total, peak = native.attended_max(*leaves, None, 4, (9, 9), 1, 1)
    expected = unsummed(padded, kernels, 4, 1, 1)  # (B, Q, C, H, X', Y')
    assert relative(total, expected.sum(dim=2).permute(0, 3, 4, 2, 1)) <= 1e-12
    assert relative(peak, expected.max(dim=2).values.permute(0, 3, 4, 2, 1)) <= 1e-12
    (total + peak).sum().backward()
    assert all(t.grad is not None for t in leaves)


def test_unavailable_on_other_dtypes_and_devices():
    x = torch.zeros(1, 2, 3, 3)
    assert native.available(x, channels=2)
    assert not native.available(x.half(), channels=2)
    assert not native.available(x, x.double(), channels=2)
    assert not native.available(x, channels=256)  # the winner is kept in one byte
    assert not native.available(x.to("meta"), channels=2)


def test_a_failed_build_warns_and_falls_back(tmp_path, monkeypatch):
    monkeypatch.setenv("AAGC_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # a "compiler" that always fails
    native._library.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="could not build the attention kernels"):
            assert native._library() is None
        assert not native.available(torch.zeros(1), channels=1)
        assert list(tmp_path.glob("*.so")) == []
    finally:
        native._library.cache_clear()


def test_switched_off_by_environment(monkeypatch):
    monkeypatch.setenv("AAGC_NATIVE", "0")
    native._library.cache_clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert native._library() is None
    finally:
        native._library.cache_clear()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
# Channels: a multiple of the vector width, not one (the last block overlaps), exactly one vector.
# Sizes: rows of 8 positions or more (tiles of 8 forward and 6 backward, the last one overlapping),
# 4 to 7, fewer; rows of 24 have tiles whose taps all lie inside the row (no bounds checks).
@pytest.mark.parametrize(
    "batch,channels,size,k,dilation",
    [(3, 40, 9, 7, 1), (2, 33, 8, 5, 2), (2, 32, 5, 3, 1), (1, 16, 3, 7, 1), (2, 17, 12, 7, 1), (1, 16, 2, 3, 2),
     (2, 40, 24, 7, 1), (1, 20, 24, 3, 1), (1, 16, 24, 5, 2)],
)
def test_depthwise_pair_equals_two_conv2d(batch, channels, size, k, dilation, dtype):
    generator = torch.Generator().manual_seed(2)
    planes = [torch.randn(batch, channels, size, size, dtype=dtype, generator=generator) for _ in range(2)]
    weights = [torch.randn(channels, k, k, dtype=dtype, generator=generator) for _ in range(2)]
    padding = dilation * (k // 2)
    assert native.depthwise_pair_supported(channels, k)
    mine = [t.clone().requires_grad_() for t in (*planes, *weights)]
    theirs = [t.clone().requires_grad_() for t in (*planes, *weights)]
    out = native.depthwise_pair(*mine, padding, dilation)
    conv = dict(padding=padding, dilation=dilation, groups=channels)
    expected = F.conv2d(theirs[0], theirs[2][:, None], **conv) + F.conv2d(theirs[1], theirs[3][:, None], **conv)
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert relative(out, expected) <= TOLERANCE[dtype]
    upstream = torch.randn(out.shape, dtype=dtype, generator=generator)
    (out * upstream).sum().backward()
    (expected * upstream).sum().backward()
    for name, a, b in zip(("first", "second", "first weight", "second weight"), mine, theirs, strict=True):
        assert relative(a.grad, b.grad) <= TOLERANCE[dtype], f"gradient of {name}"


def test_depthwise_pair_cover():
    assert native.depthwise_pair_supported(16, 7)
    assert not native.depthwise_pair_supported(15, 7)  # fewer channels than one vector
    assert not native.depthwise_pair_supported(40, 9)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(3, 10, 4, 40), (2, 7, 1, 5)], ids=str)  # (B, positions, H, Q)
def test_gated_sum_with_gradients(shape, dtype):
    generator = torch.Generator().manual_seed(3)
    logits, values = (torch.randn(shape, dtype=dtype, generator=generator) * 3 for _ in range(2))
    mine = [logits.clone().requires_grad_(), values.clone().requires_grad_()]
    theirs = [logits.clone().requires_grad_(), values.clone().requires_grad_()]
    out = native.gated_sum(*mine)
    expected = (torch.sigmoid(theirs[0]) * theirs[1]).sum(dim=2).transpose(1, 2)  # (B, Q, positions)
    assert out.shape == expected.shape and relative(out, expected) <= TOLERANCE[dtype]
    upstream = torch.randn(out.shape, dtype=dtype, generator=generator)
    (out * upstream).sum().backward()
    (expected * upstream).sum().backward()
    for name, a, b in zip(("logits", "values"), mine, theirs, strict=True):
        assert relative(a.grad, b.grad) <= TOLERANCE[dtype], f"gradient of {name}"
