"""The patch page's stain (issue 67): the Stain control and the stain stability view, on a real PCam gallery patch
through the shipped default model, and in AppTest."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from app.analysis.compute import analyse
from app.analysis.images import fit_to_model, read_image
from app.analysis.padding import stored_borders
from app.analysis.readings import layer_selections, page_readings
from app.analysis.stain_stability import (
    PERTURBATIONS,
    STAIN_LABELS,
    first_spatial_layer,
    group_spread,
    patch_rgb,
    pearson,
    stain_reference,
    stain_stability,
    stained,
    tumour_index,
)
from app.pictures.stain_panels import stability_figure, stability_maps
from app.ui.inputs import gallery_order
from app.ui.stain_view import STAIN_TAB
from models import load_checkpoint
from models.stain_normalise import METHODS
from tests.conftest import REPO

DEFAULT = REPO / "checkpoints" / "fa_p4m_densenet_pcam.safetensors"
BLANK_SENTENCE = "too little tissue to estimate its stain"


@pytest.fixture(scope="module")
def shipped():
    model, card = load_checkpoint(DEFAULT)
    return model, card, stain_reference(card)


@pytest.fixture(scope="module")
def patch(shipped) -> np.ndarray:
    """The page's first gallery patch (a real PCam tumour patch), fitted as the page fits it."""
    item = gallery_order(shipped[1])[1][0]
    assert item.name.startswith("pcam_tumour")
    return fit_to_model(read_image(item.path.read_bytes()), 96, 3, "resize").pixels  # (3, 96, 96) in [0, 1]


@pytest.fixture(scope="module")
def border(shipped) -> int:
    """The first attentive layer's padding border, as the page reads it (12 px of 96 for c1)."""
    model, card, _ = shipped
    return stored_borders(model, card)[f"attention/{first_spatial_layer(model)}"]


@pytest.fixture(scope="module")
def stability(shipped, patch, border):
    model, card, reference = shipped
    return stain_stability(model, card, patch, reference, "macenko", border=border)


def page_probability(model, card, image) -> float:
    """P(tumour) as the patch page shows it: its analysis of the image, in the page's default reading."""
    analysis = analyse(model, card, image, 0, layer_selections(page_readings(model), "spatial"))
    return float(analysis.probabilities[0, tumour_index(analysis.class_names)]), analysis


def test_the_shipped_pcam_cards_hold_pcams_reference_stain(shipped):
    _, card, reference = shipped
    assert reference is not None, "the default model's card has stain_reference"
    assert reference.vectors.shape == (2, 3) and np.allclose(np.linalg.norm(reference.vectors, axis=1), 1.0)
    assert reference.vectors[0, 0] > reference.vectors[1, 0], "haematoxylin first: the larger red optical density"


def test_the_patch_itself_has_correlation_one_and_no_change(stability):
    assert PERTURBATIONS[0].identity and len(PERTURBATIONS) == 8
    for method in ("none", "macenko"):
        assert stability.change[method][0] == 0.0
        assert stability.correlation[method][0] == 1.0
        perturbed = stability.change[method][1:]
        assert (perturbed > 0).all(), "every HED jitter moves the map"
        assert (stability.correlation[method][1:] < 1).all()


def test_as_scanned_and_normalised_probabilities_are_the_pages(shipped, patch, border, stability):
    model, card, reference = shipped
    scanned, analysis = page_probability(model, card, patch)
    assert stability.probability["none"][0] == scanned
    assert np.array_equal(stability.maps["none"][0], analysis.attention[stability.layer].upsampled(96)[0])
    normalised = stained(patch, "macenko", reference)
    assert normalised.error is None and not np.array_equal(normalised.pixels, patch)
    assert np.array_equal(stability.images["macenko"][0], normalised.pixels), "the page's normalised patch"
    # Beside it, the group's spread from the same analysis: round-off, far below the stain's.
    group = group_spread(analysis, stability.layer, border)
    assert group.transforms == 8 and group.spread < 1e-5 and group.mean_change < 1e-5
    assert 1 - 1e-6 < group.lowest_correlation <= 1
    assert stability.spread("none") > 100 * group.spread


def test_the_perturbations_repeat_exactly(patch, stability):
    """Each perturbation draws from its own seeded generator: the same patches on every call (the AppTest below
    finds the page's own call giving the same numbers as this module's)."""
    rgb = patch_rgb(patch)
    for p in PERTURBATIONS:
        assert np.array_equal(p.apply(rgb), p.apply(rgb)), p.name
    sizes = [(p.sigma, p.bias) for p in PERTURBATIONS]
    assert sizes == [(0.0, 0.0)] + [(0.05, 0.05)] * 4 + [(0.2, 0.2)] * 3, "Tellez's HED-light and HED-strong"
    assert len({stability.images["none"][i].tobytes() for i in range(8)}) == 8, "eight different patches"


def test_a_blank_patch_gets_the_sentence_and_stays_as_scanned(shipped):
    model, card, reference = shipped
    blank = np.full((3, 96, 96), 0.94, dtype=np.float32)
    shown = stained(blank, "macenko", reference)
    assert BLANK_SENTENCE in shown.error and shown.pixels is blank and shown.label == "as scanned"
    assert BLANK_SENTENCE in stained(blank, "reinhard", reference).error
    result = stain_stability(model, card, blank, reference, "macenko", perturbations=PERTURBATIONS[:1])
    assert BLANK_SENTENCE in result.error and result.methods == ("none",)


def test_pearson_is_exactly_one_on_itself_and_undefined_on_a_constant_map():
    rng = np.random.default_rng(0)
    a = rng.random((8, 37, 41))
    assert pearson(a, a) == 1.0 and pearson(a, -a) == -1.0
    b = a + rng.random(a.shape)
    assert abs(pearson(a, b) - np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 1e-12
    assert pearson(a, np.ones_like(a)) is None


def test_the_small_multiples_draw_every_perturbed_patch_on_one_range(stability):
    fig = stability_figure(stability, range_mode="equalised", colorscale="Viridis", opacity=0.75)
    assert len([t for t in fig.data if t.type == "image"]) == 16, "8 perturbations, as scanned and normalised"
    assert (fig.layout.coloraxis.cmin, fig.layout.coloraxis.cmax) == (0.0, 1.0)
    titles = [a.text for a in fig.layout.annotations if a.text.startswith(("the patch", "HED"))]
    assert titles[0] == f"the patch<br>P {stability.probability['none'][0]:.3f} · r 1.000" and len(titles) == 16
    maps, (low, high), mode = stability_maps(stability, "deviation")
    assert mode == "robust" and 0 <= low < high <= 1, "a mean over orientations has no deviation: robust range"
    assert maps.shape == (16, 96, 96)


streamlit_testing = pytest.importorskip("streamlit.testing.v1")


def glass_png() -> bytes:
    """A 96 x 96 picture of empty glass: near-white, with a little noise."""
    pixels = np.random.default_rng(1).integers(236, 244, (96, 96, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def test_the_page_switches_stain_and_shows_the_stability_table(monkeypatch, stability):
    monkeypatch.setenv("APP_CHECKPOINTS", str(REPO / "checkpoints"))
    at = streamlit_testing.AppTest.from_file(str(REPO / "app" / "main.py"), default_timeout=120).run()
    assert not at.exception, [e.message for e in at.exception]
    stain = at.sidebar.radio(key="stain")
    assert stain.options == list(STAIN_LABELS.values()) and stain.value == "none"
    assert tuple(STAIN_LABELS) == METHODS, "one label per method of the library, in its order"
    at = stain.set_value("macenko").run()
    assert not at.exception and not at.warning, [w.value for w in at.warning]
    assert any("Stain: normalised to PCam (Macenko)" in c.value for c in at.caption)
    # The page's P(tumour) of the normalised patch is the stability view's unperturbed one.
    assert f"P(tumor) = **{stability.probability['macenko'][0]:.3f}**" in " ".join(m.value for m in at.markdown)
    at.session_state["tab"] = STAIN_TAB
    at = at.run()
    assert not at.exception and not at.error, [e.message for e in at.exception] + [e.value for e in at.error]
    tables = {tuple(d.value.columns)[0]: d.value for d in at.dataframe}
    spread, rows = tables["what moves the patch"], tables["perturbation"]
    assert list(rows["perturbation"]) == [p.name for p in PERTURBATIONS]
    # The page's first gallery patch is the fixture's: the page's own call gives the same numbers exactly.
    for column, values in (("P(tumour), scanned", stability.probability["none"]),
                           ("P(tumour), Macenko", stability.probability["macenko"]),
                           ("mean |Δα_s|, scanned", stability.change["none"]),
                           ("r, Macenko", stability.correlation["macenko"])):
        assert rows[column].tolist() == values.tolist(), column
    assert spread["P(tumour) max − min"].iloc[0] == stability.spread("none")
    assert "equivariance proof" in spread["what moves the patch"].iloc[2]
    assert any(c.key == "stain_maps" for c in at.get("plotly_chart"))
    # An upload without tissue: StainError's sentence, the patch as scanned, no traceback.
    at.session_state["tab"] = "Arrow field"
    at = at.sidebar.radio(key="image_source").set_value("Upload an image").run()
    at = at.sidebar.file_uploader(key="image_upload").set_value(("glass.png", glass_png(), "image/png")).run()
    assert not at.exception and not at.error, [e.message for e in at.exception] + [e.value for e in at.error]
    assert any(BLANK_SENTENCE in w.value and "shown as scanned" in w.value for w in at.warning)
