"""Fig. 5 over seeds (``experiments.fig5_over_seeds``): per layer and seed, where attention's sign on nuclei holds."""

from __future__ import annotations

from experiments import fig5_over_seeds


def _entry(rhos: list[tuple[float, float]], composite: tuple[float, float]) -> dict:
    """A made-up attention_on_nuclei: each layer's spatial ρ interval (low, high), kept its negative."""
    def spearman(low, high):
        return {"spearman": {"mean": (low + high) / 2, "low": low, "high": high}}

    layers = [f"l{i}" for i in range(len(rhos))]
    return {"layers": layers, "patches": 10, "readings": {
        "spatial": {"by_layer": {n: spearman(*r) for n, r in zip(layers, rhos, strict=True)}},
        "kept": {"by_layer": {n: spearman(-r[1], -r[0]) for n, r in zip(layers, rhos, strict=True)}},
        "composite": {"summary": spearman(*composite)}}}


def test_the_nuclei_table_says_where_the_sign_holds_over_seeds():
    entries = {"fa_p4m_densenet": {0: _entry([(-0.2, -0.1), (0.1, 0.2), (-0.1, 0.1)], (-0.3, -0.2)),
                                   1: _entry([(-0.3, -0.2), (-0.2, -0.1), (-0.1, 0.1)], (-0.1, -0.05))}}
    text = fig5_over_seeds.nuclei_markdown(entries)
    assert "| `l0` | -0.150 | -0.250 | +0.150 | +0.250 | negative on every seed |" in text
    assert "| `l1` | +0.150 | -0.150 | -0.150 | +0.150 | differs: seed 0 positive, seed 1 negative |" in text
    assert "| `l2` | +0.000 (ns) | +0.000 (ns) | +0.000 (ns) | +0.000 (ns) | not resolved on any seed |" in text
    assert "| the paper's composite | -0.250 | -0.075 | - | - | negative on every seed |" in text
    assert text.endswith("fa_p4m_densenet: the sign of α_s on nuclei holds over seeds 0, 1 at 1 of 3 layers (the "
                         "first, `l0`: negative on every seed; the composite: negative on every seed); "
                         "fa_p4_densenet: no seed measured yet.")
