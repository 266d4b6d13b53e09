"""The panel figures are built without plotly's validation (app.pictures.plots._figure): each must serialise,
as st.plotly_chart sends it, exactly as the same figure validated; and the same through either of plotly's
JSON engines (orjson, which it takes where installed, and the standard library's)."""

import json

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import pytest

from app.pictures.map_style import DIVERGING
from app.pictures.plots import (
    COLOUR_MAPS,
    PanelMarks,
    map_panels,
    nuclei_figure,
    probability_figure,
    proof_figure,
    reliability_figure,
)

RNG = np.random.default_rng(0)
IMAGES = RNG.random((8, 3, 24, 24), dtype=np.float32)
MAPS = RNG.random((8, 24, 24), dtype=np.float32)
TITLES = [f"g{t}" for t in range(8)]


def sent(figure: go.Figure, engine: str = "auto") -> dict:
    """What st.plotly_chart sends for ``figure`` (``to_dict``, then ``to_json``), parsed."""
    return json.loads(pio.to_json(figure.to_dict(), validate=False, engine=engine))


def assert_same_values(a, b, where: str = "figure") -> None:
    """Equal JSON values, numbers equal once rounded to float32: the engines write a float32 scalar in
    different digits (orjson its shortest form, the standard library its float64's), the same float32."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            assert_same_values(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_values(x, y, f"{where}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert np.float32(a) == np.float32(b), (where, a, b)
    else:
        assert a == b, (where, a, b)


def assert_as_validated(figure: go.Figure) -> None:
    validated = go.Figure(figure.to_dict())  # the builder's raw dicts, validated
    assert sent(figure) == sent(validated)
    assert_same_values(sent(validated, "orjson"), sent(validated, "json"))


@pytest.mark.parametrize("colorscale", [*COLOUR_MAPS, DIVERGING])
@pytest.mark.parametrize("style", ["overlay", "side"])
def test_map_panels_serialise_as_validated(colorscale, style):
    marks = PanelMarks(centre=(8, 8, 8), bar_px=6.0, bar_label="20 µm")
    outlines = MAPS > 0.8
    assert_as_validated(map_panels(IMAGES, MAPS, TITLES, colorscale=colorscale, style=style, marks=marks,
                                   border=2, colour_title="attention", outlines=outlines))


def test_proof_figure_serialises_as_validated():
    native = MAPS[:, ::2, ::2]  # (H, 12, 12): the maps at their own resolution, half the image's
    expected = native + RNG.normal(0, 1e-6, native.shape).astype(np.float32)
    fig = proof_figure(IMAGES[1], native, expected, TITLES, colorscale="Magma", zmin=0.1, zmax=0.9)
    assert_as_validated(fig)
    assert [t.type for t in fig.data].count("image") == 1, "the image once"
    heatmap = next(t for t in fig.data if t.type == "heatmap")
    assert (heatmap.x0, heatmap.dx) == (0.5, 2.0), "each map pixel centred on the two image pixels it covers"


def test_nuclei_figure_serialises_as_validated():
    tissue = MAPS[1] > 0.2
    assert_as_validated(nuclei_figure(IMAGES[0], MAPS[0], MAPS[1], tissue, TITLES[:4]))


def test_prediction_figures_serialise_as_validated():
    probabilities = RNG.dirichlet([1.0, 1.0], size=8)
    assert_as_validated(probability_figure(probabilities, ["normal", "tumour"], TITLES))
    curve = {"bin_edges": np.linspace(0.5, 1.0, 6).tolist(), "confidence": [0.55, 0.65, None, 0.85, 0.97],
             "accuracy": [0.5, 0.6, None, 0.9, 0.98], "count": [10, 12, 0, 40, 176]}
    for confidence in (None, 0.93):
        assert_as_validated(reliability_figure(curve, confidence))


def test_plotly_serialises_through_orjson():
    """requirements.txt installs orjson so that plotly's "auto" engine takes it (a new patch's figures turn into
    JSON in about half the time)."""
    import importlib.util

    assert importlib.util.find_spec("orjson") is not None, "orjson missing: pip install -r requirements.txt"
