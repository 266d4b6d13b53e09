"""Group laws of p4 and p4m, exhaustively, and the actions on images and feature maps."""

import itertools

import pytest
import torch

from models.groups import P4, P4M, Group, get_group

GROUPS = [P4, P4M]


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.name)
def test_group_laws(group):
    elements = list(group.elements())
    for a in elements:
        assert group.compose(0, a) == a == group.compose(a, 0), "identity"
        assert group.compose(a, group.inverse(a)) == 0 == group.compose(group.inverse(a), a), "inverse"
    for a, b, c in itertools.product(elements, repeat=3):
        assert group.compose(group.compose(a, b), c) == group.compose(a, group.compose(b, c)), "associativity"
    table = [[group.compose(a, b) for b in elements] for a in elements]
    for row in table:
        assert sorted(row) == elements, "each row of the Cayley table is a permutation"


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.name)
def test_actions_are_homomorphisms(group):
    x = torch.randn(2, 3, group.order, 5, 5, dtype=torch.float64)
    for a, b in itertools.product(group.elements(), repeat=2):
        ab = group.compose(a, b)
        assert torch.equal(group.act_on_plane(group.act_on_plane(x, b), a), group.act_on_plane(x, ab))
        assert torch.equal(group.act(group.act(x, b, (2,)), a, (2,)), group.act(x, ab, (2,)))


def test_conventions_match_the_reference_readme():
    x = torch.arange(9.0).reshape(3, 3)
    assert torch.equal(P4.act_on_plane(x, 1), torch.rot90(x, 1, dims=(-2, -1)))
    # The horizontal mirror torch.flip(x, dims=(-1,)) is the element (2, mirrored) = index 6.
    assert torch.equal(P4M.act_on_plane(x, P4M.index(2, True)), torch.flip(x, dims=(-1,)))
    assert P4M.index(2, True) == 6
    assert P4M.permutation(1).tolist() == [3, 0, 1, 2, 5, 6, 7, 4]
    assert P4M.permutation(6).tolist() == [6, 7, 4, 5, 2, 3, 0, 1]
    assert P4.permutation(1).tolist() == [3, 0, 1, 2]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="unknown group 'p6'"):
        get_group("p6")
    with pytest.raises(ValueError, match=r"p4 element index must be in \[0, 4\)"):
        P4.parts(4)
    with pytest.raises(ValueError, match="p4 has no mirrored elements"):
        P4.index(0, True)
    with pytest.raises(ValueError, match="expected 8"):
        P4M.act(torch.zeros(1, 1, 4, 3, 3), 1, (2,))


def test_describe():
    assert [P4M.describe(g) for g in (0, 1, 6)] == ["rot 0°", "rot 90°", "rot 180° + flip"]


def test_cached_permutations_serve_autograd_after_first_use_in_inference_mode():
    group = Group("p4m_fresh_cache", mirrors=True)  # a new instance: its cache is empty
    with torch.inference_mode():
        group.act(torch.ones(1, 1, 8, 3, 3), 1, (2,))
    x = torch.ones(1, 1, 8, 3, 3, requires_grad=True)
    group.act(x, 1, (2,)).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))
