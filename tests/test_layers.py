"""Equivariance of the plain layers: lifting and group convolutions, pooling, batch norm."""

import pytest
import torch
from equivariance_helpers import assert_equivariant

from models.gconv import GroupConv, LiftingConv
from models.groups import P4, P4M
from models.normalization import GroupBatchNorm
from models.pooling import group_max_pool, group_mean_pool, spatial_avg_pool, spatial_max_pool

GROUPS = [P4, P4M]
DTYPES = [torch.float64, torch.float32]


def randn(*shape, dtype=torch.float64, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.name)
@pytest.mark.parametrize("size,kernel,padding,dilation", [(9, 3, 0, 1), (8, 3, 1, 1), (11, 5, 4, 2), (6, 1, 0, 1)])
def test_lifting_and_group_conv_are_equivariant(group, dtype, size, kernel, padding, dilation):
    torch.manual_seed(0)
    lift = LiftingConv(group, 3, 4, kernel, padding=padding, dilation=dilation).to(dtype)
    conv = GroupConv(group, 4, 5, kernel, padding=padding, dilation=dilation).to(dtype)
    x = randn(2, 3, size, size, dtype=dtype)
    assert_equivariant(lift, x, group, in_axes=(), what="LiftingConv")
    assert_equivariant(conv, lift(x), group, in_axes=(2,), what="GroupConv")


def test_stride_keeps_equivariance_where_the_grid_fits():
    # Stride 2 on a 9x9 input without padding samples a grid centred in the plane.
    torch.manual_seed(0)
    conv = GroupConv(P4M, 2, 3, 3, stride=2).double()
    assert_equivariant(conv, randn(1, 2, 8, 9, 9), P4M, in_axes=(2,), what="strided GroupConv")


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.name)
def test_pooling_and_batch_norm(group):
    x = randn(2, 3, group.order, 8, 8)
    assert_equivariant(lambda t: spatial_max_pool(t, 2), x, group, (2,), what="spatial max pool")
    assert_equivariant(lambda t: spatial_avg_pool(t, 2), x, group, (2,), what="spatial avg pool")
    assert_equivariant(group_max_pool, x, group, (2,), out_axes=(), what="group max pool")
    assert_equivariant(group_mean_pool, x, group, (2,), out_axes=(), what="group mean pool")
    bn = GroupBatchNorm(3).double()
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 2)
        bn.bias.uniform_(-1, 1)
    assert_equivariant(bn.eval(), x, group, (2,), what="GroupBatchNorm (eval)")
    assert_equivariant(bn.train(), x, group, (2,), what="GroupBatchNorm (train)")


def test_shape_errors_name_the_expected_layout():
    with pytest.raises(ValueError, match=r"LiftingConv expects \(B, 3, X, Y\)"):
        LiftingConv(P4, 3, 4, 3)(torch.zeros(1, 2, 9, 9))
    with pytest.raises(ValueError, match=r"p4m feature map \(B, 4, 8, X, Y\)"):
        GroupConv(P4M, 4, 4, 3)(torch.zeros(1, 4, 4, 9, 9))
    with pytest.raises(ValueError, match=r"GroupBatchNorm expects \(B, C, G, X, Y\)"):
        GroupBatchNorm(3)(torch.zeros(2, 3, 5, 5))
