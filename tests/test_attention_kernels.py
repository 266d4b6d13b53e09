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

from models.cpu import attention_kernels
from models.cpu.native_build import build_library, instruction_set

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "g++")) is None, reason="no C++ compiler here to build the attention kernels"
)

# The builds this CPU runs: its own, and on x86 the narrower ones (8 lanes and 16 registers for AVX2, 4 lanes for
# SSE2, the width NEON has), so that every vector width and register tiling is tested on any x86 machine.
NARROWER = {"avx512": ["x86-64-v3", "x86-64-v2"], "avx2": ["x86-64-v2"]}.get(instruction_set(), [])


@pytest.fixture(autouse=True, params=[None, *NARROWER], ids=lambda march: march or "native")
def kernel_build(request, monkeypatch):
    """Every test once per build: the attention kernels as built for ``-march=param`` (None: this machine)."""
    if request.param is None:
        yield None
        return
    if "no_variants" in request.keywords:
        pytest.skip("tests the machine's own build")
    monkeypatch.setenv("AAGC_NATIVE", "1")  # the rule would keep SSE2 kernels off: they are tested all the same
    library = build_library(attention_kernels.SOURCE, request.param)
    assert library is not None, f"the kernels do not build for -march={request.param}"
    monkeypatch.setattr(attention_kernels, "_library", lambda: library)
    yield request.param

# (B, C, H, size, k, stride, dilation, padding, Q): Q below, at and above one vector block of 16 lanes; 12 and 17
# overlap the block before on 8 lanes too
GEOMETRIES = [
    (3, 5, 4, 9, 3, 1, 1, 1, 40),
    (2, 3, 1, 10, 3, 2, 1, 0, 12),
    (2, 4, 8, 11, 5, 1, 2, 4, 16),
    (1, 2, 4, 6, 4, 1, 1, 0, 17),
]
# With the spatial attention's filter size and dilation: maps H * Q at, above and well above one block.
BRANCH_GEOMETRIES = [(*g, k_s, d_s) for g, (k_s, d_s) in zip(GEOMETRIES, [(7, 1), (3, 1), (5, 2), (7, 1)], strict=True)]
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
    value, where = attention_kernels.spatial_max(leaves[0], leaves[1].reshape(q, -1, kernels.shape[-1]), h, size,
                                                 stride, dilation)

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



@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
def test_spatial_max_with_a_dense_statistic_equals_the_two_apart(geometry):
    # With `dense`, the max's sparse gradient is added into the dense statistic's (one input-sized
    # gradient instead of two); values and gradients are those of the two computed apart.
    padded, kernels, _ = inputs(geometry, torch.float64)
    h, stride, dilation, q = geometry[2], geometry[5], geometry[6], geometry[8]
    size = unsummed(padded, kernels, h, stride, dilation).shape[-2:]
    weights = torch.rand(padded.shape[-2:], dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def weighted_sum(p):  # a dense statistic: (B, C * H)
        return (p * weights).sum(dim=(-2, -1))

    def weighted_sum_grad(grad, shape):
        return (grad[..., None, None] * weights).expand(shape).clone()

    results = []
    for dense in (None, (weighted_sum, weighted_sum_grad)):
        leaves = [t.clone().requires_grad_() for t in (padded, kernels)]
        args = leaves[0], leaves[1].reshape(q, -1, kernels.shape[-1]), h, size, stride, dilation
        if dense is None:
            statistic, (value, where) = weighted_sum(leaves[0]), attention_kernels.spatial_max(*args)
        else:
            statistic, value, where = attention_kernels.spatial_max(*args, dense)
        generator = torch.Generator().manual_seed(1)
        upstream = [torch.randn(t.shape, dtype=t.dtype, generator=generator) for t in (statistic, value)]
        (statistic * upstream[0]).sum().add((value * upstream[1]).sum()).backward()
        results.append((statistic, value, where, *(t.grad for t in leaves)))
    for name, apart, together in zip(("statistic", "max", "where", "planes' gradient", "kernels' gradient"),
                                     *results, strict=True):
        assert torch.equal(together, apart) if name == "where" else relative(together, apart) <= 1e-14, name


def branch_oracle(padded, kernels, alpha, pairs, geometry):
    """The attention branch and alpha_s from f~ with PyTorch ops: ``(B, Q, X', Y')``, ``(B, X', Y', H, Q)``.

    ``pairs`` None: no spatial attention (alpha_s = 1).
    """
    _, c, h, _, _, stride, dilation, _, q = geometry[:9]
    k_s, spatial_dilation = geometry[9:]
    f = unsummed(padded, kernels, h, stride, dilation)  # (B, Q, C, H, X', Y')
    attended = f if alpha is None else alpha[..., None, None] * f
    total, peak = attended.sum(dim=2), attended.max(dim=2).values  # (B, Q, H, X', Y'); torch.max: the first
    if pairs is None:
        return total.sum(dim=2), None
    # One map per (h, q), in that order, as the pairs.
    maps = [t.transpose(1, 2).reshape(t.shape[0], h * q, *t.shape[-2:]) for t in (total / c, peak)]
    conv = dict(padding=spatial_dilation * (k_s // 2), dilation=spatial_dilation, groups=h * q)
    z = F.conv2d(maps[0], pairs[:, :1], **conv) + F.conv2d(maps[1], pairs[:, 1:], **conv)
    gate = torch.sigmoid(z).view(z.shape[0], h, q, *z.shape[-2:])  # (B, H, Q, X', Y')
    branch = (gate.transpose(1, 2) * total).sum(dim=2)
    return branch, gate.permute(0, 3, 4, 1, 2)


@pytest.mark.parametrize(
    "spatial,keep", [(True, False), (True, True), (False, False)], ids=["recomputed", "kept", "no alpha_s"]
)
@pytest.mark.parametrize("channel_attention", [True, False], ids=["alpha_c", "no alpha_c"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("geometry", BRANCH_GEOMETRIES, ids=str)
def test_attention_branch_with_gradients(geometry, dtype, channel_attention, spatial, keep):
    padded, kernels, alpha = inputs(geometry[:9], dtype)
    _, c, h, _, _, stride, dilation, _, q, k_s, spatial_dilation = geometry
    # Filters large enough that alpha_s saturates at 0 and 1 in places.
    pairs = 3 * torch.randn(h * q, 2, k_s, k_s, dtype=dtype, generator=torch.Generator().manual_seed(4))
    size = unsummed(padded, kernels, h, stride, dilation).shape[-2:]
    arguments = {"planes": padded, "kernels": kernels, "alpha": alpha if channel_attention else None,
                 "pairs": pairs if spatial else None}
    leaves, oracle = ({k: None if t is None else t.clone().requires_grad_() for k, t in arguments.items()}
                      for _ in range(2))

    branch, gate = attention_kernels.attention_branch(*leaves.values(), 1.0 / c, h, size, stride, dilation,
                                           spatial_dilation * (k_s // 2), spatial_dilation, keep)
    expected_branch, expected_gate = branch_oracle(*oracle.values(), geometry)
    tol = TOLERANCE[dtype]
    assert branch.shape == expected_branch.shape and relative(branch, expected_branch) <= tol
    assert (gate is None) != keep
    generator = torch.Generator().manual_seed(1)
    upstream = torch.randn(branch.shape, dtype=dtype, generator=generator)
    loss, expected_loss = (branch * upstream).sum(), (expected_branch * upstream).sum()
    if keep:
        assert gate.shape == expected_gate.shape and relative(gate, expected_gate) <= tol
        upstream_gate = torch.randn(gate.shape, dtype=dtype, generator=generator)
        loss, expected_loss = loss + (gate * upstream_gate).sum(), expected_loss + (expected_gate * upstream_gate).sum()
    loss.backward()
    expected_loss.backward()
    for name, mine in leaves.items():
        if mine is not None:
            assert relative(mine.grad, oracle[name].grad) <= tol, f"gradient of {name}"


def test_attention_branch_cover():
    assert attention_kernels.branch_supported(7) and attention_kernels.branch_supported(3)
    assert not attention_kernels.branch_supported(9) and not attention_kernels.branch_supported(4)


def test_unavailable_on_other_dtypes_and_devices():
    x = torch.zeros(1, 2, 3, 3)
    assert attention_kernels.available(x, channels=2)
    assert not attention_kernels.available(x.half(), channels=2)
    assert not attention_kernels.available(x, x.double(), channels=2)
    assert not attention_kernels.available(x, channels=256)  # the winner is kept in one byte
    assert not attention_kernels.available(x.to("meta"), channels=2)


def test_each_build_has_its_vector_width(kernel_build):
    expected = {"avx512": 16, "avx2": 8, "avx": 8, "sse2": 4, "neon": 4}[instruction_set(kernel_build)]
    assert attention_kernels.lanes() == expected


@pytest.mark.no_variants
def test_a_failed_build_warns_and_falls_back(tmp_path, monkeypatch):
    monkeypatch.setenv("AAGC_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # a "compiler" that always fails
    build_library.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="could not build the kernels attention_kernels.cpp"):
            assert attention_kernels._library() is None
        assert not attention_kernels.available(torch.zeros(1), channels=1)
        assert list(tmp_path.glob("*.so")) == []
    finally:
        build_library.cache_clear()


@pytest.mark.no_variants
def test_switched_off_by_environment(monkeypatch):
    monkeypatch.setenv("AAGC_NATIVE", "0")
    build_library.cache_clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert attention_kernels._library() is None
    finally:
        build_library.cache_clear()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
# Channels: a multiple of the vector width, not one (the last block overlaps), exactly one vector.
# Sizes: rows of 8 positions or more (AVX-512: tiles of 8 forward and 6 backward; AVX2: 6 forward where
# they cover the row with at most a fifth more, else 4, and 4 backward; the last tile overlapping),
# 4 to 7, fewer; rows of 24 have tiles whose taps all lie inside the row (no bounds checks).
@pytest.mark.parametrize(
    "batch,channels,size,k,dilation",
    [(3, 40, 9, 7, 1), (2, 33, 8, 5, 2), (2, 32, 5, 3, 1), (1, 16, 3, 7, 1), (2, 17, 12, 7, 1), (1, 16, 2, 3, 2),
     (2, 40, 24, 7, 1), (1, 20, 24, 3, 1), (1, 16, 24, 5, 2), (1, 24, 16, 7, 1)],
)
def test_depthwise_pair_equals_two_conv2d(batch, channels, size, k, dilation, dtype):
    generator = torch.Generator().manual_seed(2)
    planes = [torch.randn(batch, channels, size, size, dtype=dtype, generator=generator) for _ in range(2)]
    weights = [torch.randn(channels, k, k, dtype=dtype, generator=generator) for _ in range(2)]
    padding = dilation * (k // 2)
    assert attention_kernels.depthwise_pair_supported(channels, k)
    mine = [t.clone().requires_grad_() for t in (*planes, *weights)]
    theirs = [t.clone().requires_grad_() for t in (*planes, *weights)]
    out = attention_kernels.depthwise_pair(*mine, padding, dilation)
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
    lanes = attention_kernels.lanes()
    assert attention_kernels.depthwise_pair_supported(lanes, 7)
    assert not attention_kernels.depthwise_pair_supported(lanes - 1, 7)  # fewer channels than one vector
    assert not attention_kernels.depthwise_pair_supported(40, 9)
