"""The one equivariance assertion every layer and model test uses."""

from __future__ import annotations

import torch

from models.equivariance import equivariance_errors, relative_error
from models.groups import Group

# float64 round-off is ~1e-15; float32 ~1e-6 relative on these networks.
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4}


def assert_equivariant(fn, x, group: Group, in_axes=(), out_axes=(2,), out_transforms=True, what="map"):
    """Assert F(g.x) == g.F(x) (or F(g.x) == F(x) when not ``out_transforms``) for every element g."""
    errors = equivariance_errors(fn, x, group, in_axes, out_axes, out_transforms)
    tol = TOLERANCE[x.dtype]
    bad = {group.describe(g): f"{e:.2e}" for g, e in errors.items() if not e <= tol}
    prop = "equivariant" if out_transforms else "invariant"
    assert not bad, f"{what} is not {prop} under {group.name} to {tol:g} relative ({x.dtype}): {bad}"


def assert_trace_equivariant(model, x, tol=None, what="logits"):
    """A traced model's logits are invariant (to :data:`TOLERANCE`), and every group feature map and attention map
    moves with its input (to ``tol``): one traced pass over every moved input serves all three. Returns the logits
    of x (from a pass over x alone, as the model's plain forward pass computes them)."""
    group = model.group
    tol = tol or TOLERANCE[x.dtype]
    elements = list(group.elements())
    logits_errors = {}
    with torch.no_grad():
        logits, base = model.trace(x)
        # Every moved input in one batch: the compiled kernels share a batch among the threads, and one sample at a
        # time left all but one idle (a_p4m_allcnnc's and a_p4m_densenet's float64 tests, 2 threads, one after the
        # other: 68 and 55 s against 47 and 42 on AVX2 code, 34 and 42 s against 28 and 34 on AVX-512).
        moved_logits, moved = model.trace(torch.cat([group.act(x, g) for g in elements]))
        for i, g in enumerate(elements):
            rows = slice(i * len(x), (i + 1) * len(x))
            logits_errors[group.describe(g)] = relative_error(moved_logits[rows], logits)
            for name, feature in base.features.items():
                if feature.dim() == 5:
                    err = relative_error(moved.features[name][rows], group.act(feature, g, (2,)))
                    assert err <= tol, f"features of {name} under {group.describe(g)}: {err:.2e} > {tol:g}"
            for name, parts in base.attention.items():
                for label, part in (("channel", parts.channel), ("spatial", parts.spatial)):
                    if part is None:
                        continue
                    got = getattr(moved.attention[name], label)[rows]
                    err = relative_error(got, group.act(part, g, parts.group_axes))
                    assert err <= tol, f"{label} attention of {name} under {group.describe(g)}: {err:.2e} > {tol:g}"
    bad = {name: f"{e:.2e}" for name, e in logits_errors.items() if not e <= TOLERANCE[x.dtype]}
    assert not bad, f"{what} is not invariant under {group.name} to {TOLERANCE[x.dtype]:g} relative ({x.dtype}): {bad}"
    return logits
