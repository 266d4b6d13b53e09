"""The Variants view and the picker grouped by dataset, in AppTest, on random-weight models of Table 1's variants.

Each variant is saved with a card that carries its architecture's real Table 1 row (from ``results/rot_mnist``),
as the shipped checkpoints do; an H&E model and a plain P4CNN share the folder, so the tests also see that the
view gathers only attentive models of one dataset.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_app_ui import AppTest, app, checkpoint_box, dev_card, ok, write_dev_checkpoints

import models
from app.analysis.checkpoints import by_dataset, list_checkpoints
from app.analysis.readings import BRIGHT, COLOUR_TITLES
from app.analysis.variants import ATTENTION_KINDS, table1_text, variants_of
from app.ui.views import FLAT_SPAN
from experiments.results_tables import seed_table, spread_text, table1_summary
from tests.conftest import REPO

RESULTS = REPO / "results" / "rot_mnist"
VARIANT_ARCHS = ["arh_p4cnn", "asp_p4cnn", "ach_p4cnn", "fa_p4cnn", "a_p4cnn"]  # deliberately not Table 1's order
TABLE1_ORDER = ["a_p4cnn", "fa_p4cnn", "ach_p4cnn", "asp_p4cnn", "arh_p4cnn"]


@pytest.fixture(scope="module")
def variants_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("variants")
    write_dev_checkpoints(folder, VARIANT_ARCHS + ["p4cnn", "fa_p4m_densenet"])
    for arch in VARIANT_ARCHS + ["p4cnn"]:
        path = folder / f"{arch}_dev.safetensors"
        model, card = models.load_checkpoint(path)
        models.save_checkpoint(model, path, {**card, "table1": table1_summary(RESULTS, arch)})
    return folder


def open_variants(monkeypatch, folder: Path) -> AppTest:
    at = ok(app(monkeypatch, folder))
    at = ok(at.sidebar.radio(key="dataset").set_value("rot-MNIST").run())
    return ok(at.sidebar.radio(key="view").set_value("Variants").run())


def row_charts(at: AppTest) -> dict[str, dict]:
    """Checkpoint name -> the plotly spec of its row, in page order."""
    return {c.key.removeprefix("variant-"): json.loads(c.proto.spec) for c in at.get("plotly_chart")
            if c.key and c.key.startswith("variant-")}


def heatmaps(spec: dict) -> list[np.ndarray]:
    """The heatmaps' values; plotly writes arrays as base64 with dtype and shape."""
    def decode(z) -> np.ndarray:
        if isinstance(z, dict):
            shape = tuple(int(n) for n in z["shape"].split(","))
            return np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"]).reshape(shape).astype(float)
        return np.array(z, dtype=float)
    return [decode(t["z"]) for t in spec["data"] if t["type"] == "heatmap"]


def test_variants_are_the_attentive_models_of_one_dataset_in_table1_order(variants_folder):
    entries = list_checkpoints(variants_folder)
    card = next(e.card for e in entries if e.name == "fa_p4cnn_dev")
    found = variants_of(card, entries)
    assert [v.entry.name for v in found] == [f"{arch}_dev" for arch in TABLE1_ORDER]
    assert [v.kind for v in found] == list(ATTENTION_KINDS), "one of each kind of attention, as Table 1 orders them"
    he = next(e.card for e in entries if e.name == "fa_p4m_densenet_dev")
    assert [v.entry.name for v in variants_of(he, entries)] == ["fa_p4m_densenet_dev"], "only its own dataset"


def test_the_picker_groups_checkpoints_by_dataset(variants_folder, monkeypatch):
    entries = list_checkpoints(variants_folder)
    groups = by_dataset(entries, first=next(e for e in entries if e.name == "fa_p4m_densenet_dev"))
    assert list(groups) == ["H&E proxy", "rot-MNIST"], "the given entry's dataset first"
    assert [e.name for e in groups["H&E proxy"]] == ["fa_p4m_densenet_dev"] and len(groups["rot-MNIST"]) == 6
    at = ok(app(monkeypatch, variants_folder))
    assert at.sidebar.radio(key="dataset").options == ["rot-MNIST", "H&E proxy"]
    box = checkpoint_box(at)
    assert len(box.options) == 6 and all(not o.startswith("fa_p4m") for o in box.options)
    at = ok(box.set_value("asp_p4cnn_dev").run())
    at = ok(at.sidebar.radio(key="dataset").set_value("H&E proxy").run())
    box = checkpoint_box(at)
    assert len(box.options) == 1 and box.value == "fa_p4m_densenet_dev", "the other dataset's list, reset"
    assert "fa_p4m_densenet_dev" in at.markdown[1].value, "the page follows the new dataset's model"
    assert [r.options for r in at.sidebar.radio if r.key == "view"] == [["Patch", "Slide"]]


def test_one_row_per_variant_with_its_facts_and_its_own_colour_range(variants_folder, monkeypatch):
    at = open_variants(monkeypatch, variants_folder)
    charts = row_charts(at)
    assert list(charts) == [f"{arch}_dev" for arch in TABLE1_ORDER]
    table = at.dataframe[0].value
    assert list(table["checkpoint"]) == list(charts) and list(table["attention"]) == list(ATTENTION_KINDS)
    text = " ".join(m.value for m in at.markdown)
    captions = " ".join(c.value for c in at.caption)
    report = seed_table(RESULTS)
    flat = []
    for arch, (_, row) in zip(TABLE1_ORDER, table.iterrows(), strict=True):
        spec = charts[f"{arch}_dev"]
        maps = heatmaps(spec)
        assert len(maps) == 4 and all(m.shape == (28, 28) for m in maps), "four p4 orientations over the digit"
        assert sum(t["type"] == "image" for t in spec["data"]) == 4, "the digit under every map"
        axis = spec["layout"]["coloraxis"]
        assert {t.get("coloraxis") for t in spec["data"] if t["type"] == "heatmap"} == {"coloraxis"}
        assert axis["cmin"] < axis["cmax"], arch
        maps_span = max(float(m.max()) for m in maps) - min(float(m.min()) for m in maps)
        if axis["cmax"] - axis["cmin"] == pytest.approx(FLAT_SPAN):
            flat.append(arch)
        else:
            assert maps_span >= FLAT_SPAN, f"{arch}: a row that varies by {maps_span:.1e} must be drawn flat"
        card = models.load_checkpoint(variants_folder / f"{arch}_dev.safetensors")[1]
        assert table1_text(card) in text, "the row states its Table 1 error"
        assert f"| {arch} | {card['parameters']:,} |" in report and spread_text(card["table1"]["test_error"]) in report
        assert row["parameters"] == card["parameters"]
        assert row["maps deviation"] < 1e-5 and row["probability deviation"] < 1e-5, arch
    assert "p4cnn_dev, 24,610 parameters, Table 1: 2.35 ± 0.07 %" in " ".join(c.value for c in at.caption), \
        "the P4CNN without attention beside them"
    assert len(at.get("download_button")) == 1, "all rows as one PNG"
    assert "ach_p4cnn" in flat, "a random channel attention is near 0.5 everywhere: drawn flat"
    assert captions.count("Nearly flat") == len(flat), "each flat row says so"
    channel = heatmaps(charts["ach_p4cnn_dev"])
    spatial = heatmaps(charts["asp_p4cnn_dev"])
    assert all(np.ptp(m) < 1e-6 for m in channel), "channel attention has no spatial extent: one value a panel"
    assert all(np.ptp(m) > 1e-3 for m in spatial), "spatial attention varies over the digit"


def test_every_row_turns_with_the_image(variants_folder, monkeypatch):
    at = open_variants(monkeypatch, variants_folder)
    before = {name: heatmaps(spec) for name, spec in row_charts(at).items()}
    at = ok(at.sidebar.radio(key="rotate-p4").set_value(90).run())
    after = {name: heatmaps(spec) for name, spec in row_charts(at).items()}
    assert list(after) == list(before)
    for name, maps in after.items():
        for h in range(4):
            # Orientation h of the turned image is orientation h - 1 of the original, turned a quarter.
            expected = torch.rot90(torch.from_numpy(before[name][(h - 1) % 4]), 1, dims=(-2, -1)).numpy()
            np.testing.assert_allclose(maps[h], expected, atol=2e-5, err_msg=f"{name}, orientation {h}")


def test_the_layer_picker_shows_one_layer_of_every_variant(variants_folder, monkeypatch):
    at = open_variants(monkeypatch, variants_folder)
    picker = at.selectbox(key="variants_layer")
    assert picker.options[0] == "first with orientations" and "c3" in picker.options
    table = at.dataframe[0].value
    assert dict(zip(table["checkpoint"], table["layer"], strict=True))["fa_p4cnn_dev"] == "c2", \
        "alpha_F's first layer attends over the image itself, with no orientations: its first oriented one is c2"
    at = ok(picker.set_value("c3").run())
    assert set(at.dataframe[0].value["layer"]) == {"c3"}
    at = ok(at.selectbox(key="variants_layer").set_value("c1").run())
    assert set(at.dataframe[0].value["layer"]) == {"c1"}, "alpha_F's and rotation attention's c1: one map each"


def test_every_row_in_the_chosen_reading(variants_folder, monkeypatch):
    """As on the patch page: alpha_s by default, alpha- where a variant has no spatial map; kept = 1 - removed."""
    at = open_variants(monkeypatch, variants_folder)
    assert at.selectbox(key="variants_reading").value == "spatial"
    shown = dict(zip(at.dataframe[0].value["checkpoint"], at.dataframe[0].value["shown"], strict=True))
    assert shown == {**{f"{arch}_dev": COLOUR_TITLES["spatial"] for arch in TABLE1_ORDER},
                     "ach_p4cnn_dev": COLOUR_TITLES["removed"]}, "channel attention has no alpha_s"
    captions = " ".join(c.value for c in at.caption)
    assert BRIGHT["spatial"] in captions and captions.count("No α_s in this layer") == 1
    maps = {}
    for reading in ("kept", "removed"):
        at = ok(at.selectbox(key="variants_reading").set_value(reading).run())
        assert set(at.dataframe[0].value["shown"]) == {COLOUR_TITLES[reading]}
        assert BRIGHT[reading] in " ".join(c.value for c in at.caption)
        maps[reading] = {name: heatmaps(spec) for name, spec in row_charts(at).items()}
    for name, kept in maps["kept"].items():
        for h, plane in enumerate(kept):
            np.testing.assert_allclose(plane, 1 - maps["removed"][name][h], atol=1e-6, err_msg=f"{name}, {h}")


def test_all_rows_in_one_png(variants_folder):
    """The download: a row per variant, each with its own colour bar; a row with one panel leaves the rest empty."""
    from PIL import Image

    from app.pictures.figures import MapRow, render_map_grid_png
    rng = np.random.default_rng(0)
    image = rng.random((1, 28, 28))
    rows = [MapRow(rng.random((4, 28, 28)), 0.0, 1.0, ("a", "b", "c", "d"), "a_p4cnn\nfull · c1"),
            MapRow(rng.random((1, 28, 28)), 0.2, 0.4, ("on the image",), "fa_p4cnn\ninput · c1")]
    one, two = (Image.open(io.BytesIO(render_map_grid_png(r, image, dpi=50))) for r in (rows[:1], rows))
    assert one.format == two.format == "PNG" and two.width == one.width and two.height > 1.8 * one.height


def test_variants_need_two_attentive_models(monkeypatch, tmp_path):
    write_dev_checkpoints(tmp_path, ["a_p4cnn", "p4cnn"])
    at = ok(app(monkeypatch, tmp_path))
    assert not [r for r in at.sidebar.radio if r.key == "view"], "one attentive digit model: no Variants view"
    assert dev_card("a_p4cnn")["dataset"]["name"] == "rot_mnist"
