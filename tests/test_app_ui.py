"""The Streamlit app in AppTest: every gallery image with every checkpoint, the controls, and every bad input.

Checkpoints are small models from the registry saved with proper cards in a
temporary folder (``APP_CHECKPOINTS``), plus the shipped ``checkpoints/*.safetensors``
where there are any.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from test_app_compute import calibrated

import models
from app.analysis.compute import analyse
from app.analysis.images import read_image
from app.gallery import list_gallery, list_patches, list_regions
from app.pictures.export import read_npz
from models import registry
from tests.conftest import REPO

streamlit_testing = pytest.importorskip("streamlit.testing.v1")
AppTest = streamlit_testing.AppTest

MAIN = str(REPO / "app" / "main.py")
TIMEOUT = 120
SHIPPED = sorted((REPO / "checkpoints").glob("*.safetensors"))
DEV_ARCHS = ["p4cnn", "a_p4cnn", "fa_p4m_densenet"]
HE_NOTES = "Demonstration proxy: label = nucleus-rich centre (haematoxylin colour deconvolution), not tumour"


def dev_card(arch: str) -> dict:
    """A card like the training package writes: input convention, dataset, class names, metrics."""
    if models.model_info(arch).dataset == "rot_mnist":
        return {"input": dict(size=28, channels=1, mean=[0.1307], std=[0.3081], transposed=False),
                "dataset": {"name": "rot_mnist", "notes": ""}, "class_names": [str(i) for i in range(10)],
                "metrics": {"test_error": 0.05}, "equivariance_error": None}
    edges = np.linspace(0.5, 1.0, 6).tolist()
    return {"input": dict(size=96, channels=3, mean=[0.636, 0.441, 0.580], std=[0.235, 0.257, 0.209],
                          transposed=False),
            "dataset": {"name": "he_demo", "notes": HE_NOTES}, "class_names": ["nucleus_sparse", "nucleus_rich"],
            "metrics": {"test_error": 0.1, "test_ece": 0.04, "test_auc": 0.95,
                        "test_reliability": {"bin_edges": edges, "confidence": [0.55, None, 0.75, 0.85, 0.97],
                                             "accuracy": [0.5, None, 0.7, 0.9, 0.98], "count": [10, 0, 20, 40, 176]}},
            "equivariance_error": None}


def write_dev_checkpoints(folder: Path, archs: list[str]) -> list[Path]:
    """Random-weight models (BatchNorm statistics from data) saved as ``{arch}_dev.safetensors``."""
    paths = []
    for arch in archs:
        path = folder / f"{arch}_dev.safetensors"
        models.save_checkpoint(calibrated(arch), path, dev_card(arch))
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def dev_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("checkpoints")
    write_dev_checkpoints(folder, DEV_ARCHS)
    return folder


def app(monkeypatch, folder: Path) -> AppTest:
    """The page's first run on the checkpoints in ``folder``."""
    monkeypatch.setenv("APP_CHECKPOINTS", str(folder))
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    return at.run()


def ok(at: AppTest) -> AppTest:
    """Fail on any exception or error message; return the app."""
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def errors(at: AppTest) -> str:
    assert not at.exception, [e.message for e in at.exception]
    return " ".join(e.value for e in at.error)


def one_checkpoint_folder(tmp_path: Path, source: Path) -> Path:
    folder = tmp_path / "one"
    folder.mkdir()
    (folder / source.name).symlink_to(source)
    if source.with_suffix(".json").exists():
        (folder / source.with_suffix(".json").name).symlink_to(source.with_suffix(".json"))
    return folder


SHIPPED_ARCHS = {json.loads(p.with_suffix(".json").read_text()).get("arch") for p in SHIPPED
                 if p.with_suffix(".json").exists()}
# Every shipped checkpoint, and a dev stand-in for each architecture not shipped (yet).
CASES = [pytest.param(path, id=f"shipped-{path.stem}") for path in SHIPPED] + [
    pytest.param(arch, id=f"dev-{arch}") for arch in DEV_ARCHS if arch not in SHIPPED_ARCHS]


@pytest.mark.parametrize("checkpoint", CASES)
def test_every_gallery_image_renders(checkpoint, dev_folder, tmp_path, monkeypatch):
    source = dev_folder / f"{checkpoint}_dev.safetensors" if isinstance(checkpoint, str) else checkpoint
    at = ok(app(monkeypatch, one_checkpoint_folder(tmp_path, source)))
    card = json.loads(source.with_suffix(".json").read_text()) if source.with_suffix(".json").exists() else {}
    # The image the model sees, and the first tab's arrow field (an SVG): a planar CNN (z2cnn) has no orientation
    # axis, hence no arrows
    images = 2 if card.get("group") else 1
    picker = at.sidebar.selectbox[1]
    assert picker.label == "Gallery image"
    assert len(picker.options) == len(list_patches()) >= 14, "every digit and patch; no region"
    for index, caption in enumerate(picker.options):
        at = ok(picker.select_index(index).run())
        picker = at.sidebar.selectbox[1]
        assert len(at.image) == images and not at.get("plotly_chart"), caption
        assert len(viewer(at)["titles"]) == len(viewer(at)["maps"][0]) >= 1, caption
    if (card.get("dataset") or {}).get("name") == "he_demo":
        assert "not a tumour classifier" in at.warning[0].value


PCAM_MODEL = REPO / "checkpoints" / "fa_p4m_densenet_pcam.safetensors"


@pytest.mark.skipif(not PCAM_MODEL.exists(), reason=f"{PCAM_MODEL.name} not shipped")
def test_opens_on_the_pcam_model_and_shows_every_pcam_patch_with_its_true_label(monkeypatch):
    at = open_tab(ok(app(monkeypatch, REPO / "checkpoints")), "Attention on nuclei")
    assert checkpoint_box(at).value == PCAM_MODEL.stem, "the H&E model on real labels opens"
    picker = at.sidebar.selectbox[1]
    pcam = {item.caption: item for item in list_gallery(kind="he") if item.label}
    assert len(pcam) == 12 and sorted(i.label for i in pcam.values()).count("tumor") == 6
    assert picker.options[0] in pcam and pcam[picker.options[0]].label == "tumor", "a real tumour patch first"
    for index, caption in enumerate(picker.options):
        if caption not in pcam:
            continue
        at = ok(picker.select_index(index).run())
        picker = at.sidebar.selectbox[1]
        texts = " ".join(m.value for m in at.markdown)
        assert f"True label: **{pcam[caption].label}**" in texts, caption
        assert "rank correlation of attention with haematoxylin" in texts, caption
        assert chart(at, "nuclei") is not None and not at.warning, caption


def test_the_cmu1_region_is_a_gallery_region_at_full_size():
    region = next(item for item in list_regions() if item.name == "region_cmu1.jpg")
    assert region.kind == "region" and region.label is None and region.microns_per_pixel == 0.499
    assert "not lymph-node tissue from PCam/Camelyon" in region.caption and "not a diagnosis" in region.caption
    assert list_gallery(kind="region") == list_regions()
    with Image.open(region.path) as image:
        # Pillow's size is (width, height): 2220 columns, 2967 rows, as in the SVS (no resampling).
        assert (image.format, image.mode, image.size) == ("JPEG", "RGB", (2220, 2967))
    assert region.path.stat().st_size < 2_500_000
    assert read_image(region.path.read_bytes()).shape == (3, 2967, 2220), "the app's own reader accepts it"
    assert region not in list_patches() and {item.kind for item in list_patches()} == {"digit", "he"}


def test_the_gallery_picker_leaves_out_regions(dev_folder, tmp_path, monkeypatch):
    at = ok(app(monkeypatch, one_checkpoint_folder(tmp_path, dev_folder / "fa_p4m_densenet_dev.safetensors")))
    picker = at.sidebar.selectbox[1]
    assert picker.label == "Gallery image"
    assert set(picker.options) == {item.caption for item in list_patches()}
    assert list_regions() and not {item.caption for item in list_regions()} & set(picker.options)


def test_no_checkpoint_says_how_to_get_one(tmp_path, monkeypatch):
    at = app(monkeypatch, tmp_path / "empty")
    assert not at.exception
    assert "No model checkpoint found" in at.info[0].value and "python -m training" in at.info[0].value


def checkpoint_box(at: AppTest):
    """The sidebar's checkpoint picker (one per dataset, each with its own key)."""
    return next(box for box in at.sidebar.selectbox if box.label == "Checkpoint")


def select_model(at: AppTest, arch: str) -> AppTest:
    """Pick the checkpoint of ``arch``, switching the dataset first where the folder holds several."""
    datasets = [r for r in at.sidebar.radio if r.key == "dataset"]
    for dataset in datasets[0].options if datasets else [None]:
        if dataset is not None:
            at = ok(at.sidebar.radio(key="dataset").set_value(dataset).run())
        box = checkpoint_box(at)
        found = [i for i, o in enumerate(box.options) if o.startswith(arch + "_")]
        if found:
            return ok(box.select_index(found[0]).run())
    raise AssertionError(f"no checkpoint of {arch}")


def chart(at: AppTest, key: str):
    return next(c for c in at.get("plotly_chart") if c.key == key)


def viewer(at: AppTest, index: int = 0) -> dict:
    """The payload of the page's turn viewer (:func:`app.pictures.turn_frames.viewer_payload`)."""
    return json.loads(at.get("bidi_component")[index].proto.json)


def open_tab(at: AppTest, name: str) -> AppTest:
    """Open the tab ``name`` below the maps (only the open tab is computed)."""
    at.session_state["tab"] = name
    return ok(at.run())


def proof_error(at: AppTest) -> float:
    return float(at.metric[1].value)


def test_rotate_mirror_switch_layer_and_model(dev_folder, monkeypatch):
    at = app(monkeypatch, dev_folder)
    at = select_model(at, "a_p4cnn")
    layer = at.selectbox(key=next(k for k in (w.key for w in at.selectbox) if k.startswith("layer-")))
    assert layer.value == "attention/c1"
    # Turns are the viewer's, in the browser: it holds every p4 element's move of the image's maps.
    assert [m["element"] for m in viewer(at)["moves"]] == [0, 1, 2, 3] and not viewer(at)["mirrors"]
    at = open_tab(at, "Equivariance proof")
    assert proof_error(at) < 1e-4
    # A full group attention layer: channel and input orientation pickers.
    at = ok(at.selectbox(key=layer.key).set_value("attention/c3").run())
    channel = next(w for w in at.selectbox if w.label == "Output channel")
    orientation = next(w for w in at.selectbox if w.label == "Input orientation")
    assert channel.options[0] == "mean" and len(orientation.options) == 5
    at = ok(channel.set_value(3).run())
    at = ok(next(w for w in at.selectbox if w.label == "Input orientation").set_value(2).run())
    assert proof_error(at) < 1e-4
    at = ok(at.slider(key="angle").set_value(30).run())
    assert "not a group element" in at.info[0].value
    # Switch to the p4m DenseNet: mirror appears, and the proof stays exact.
    at = select_model(at, "fa_p4m_densenet")
    at = ok(at.slider(key="angle").set_value(0).run())
    at = open_tab(at, "Equivariance proof")  # another model's tabs: the first is open again
    shown = viewer(at)
    assert shown["mirrors"] and len(shown["titles"]) == 8 == len(shown["maps"][0])  # one panel per orientation
    assert shown["centre"] == [32, 32, 32] and "µm" in shown["bar"]["label"]  # pathology: central 32 x 32, scale
    assert proof_error(at) < 1e-4
    at = open_tab(at, "Calibration")
    assert chart(at, "reliability") is not None
    at = select_model(at, "p4cnn")
    assert "Layer" in [w.label for w in at.selectbox]


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def bomb_png(width: int = 30_000, height: int = 30_000) -> bytes:
    """A valid PNG header declaring 900 MP, with a tiny compressed body."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 100)) + chunk(
        b"IEND", b"")


def test_bad_images_show_messages_and_the_app_keeps_serving(dev_folder, monkeypatch):
    at = app(monkeypatch, dev_folder)
    at = ok(at.sidebar.radio(key="image_source").set_value("Upload an image").run())
    good = png_bytes(Image.fromarray((np.random.default_rng(0).random((40, 50)) * 255).astype(np.uint8)))
    cases = [
        (("empty.png", b"", "image/png"), "empty"),
        (("cut.png", good[: len(good) // 2], "image/png"), "truncated or corrupt"),
        (("notes.png", b"this is text, not an image" * 10, "image/png"), "not an image"),
        (("bomb.png", bomb_png(), "image/png"), "limit is"),
    ]
    uploader = at.sidebar.file_uploader(key="image_upload")
    for upload, message in cases:
        at = uploader.set_value(upload).run()
        assert message in errors(at), upload[0]
        uploader = at.sidebar.file_uploader(key="image_upload")
    at = ok(uploader.set_value(("digit.png", good, "image/png")).run())
    assert "Scaled the centred 40 x 40 square" in " ".join(c.value for c in at.caption)


class Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned > pwned.txt",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_bad_checkpoints_show_messages(dev_folder, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    at = app(monkeypatch, dev_folder)
    at = ok(at.sidebar.radio(key="model_source").set_value("Upload a checkpoint").run())
    wrong = io.BytesIO()
    torch.save({k: v for k, v in models.build_model("p4cnn").state_dict().items() if k != "c1.weight"}, wrong)
    cases = [
        (("model.safetensors", b"", "application/octet-stream"), "is empty"),
        (("model.safetensors", b"\x00" * 100, "application/octet-stream"), "not a readable safetensors file"),
        (("evil.pth", pickle.dumps({"c1.weight": Exploit()}), "application/octet-stream"),
         "not a loadable PyTorch state dict"),
        (("p4cnn.pth", wrong.getvalue(), "application/octet-stream"),
         "p4cnn.pth fits no registered architecture (36 tensors); the nearest, p4cnn: missing ['c1.weight']"),
    ]
    uploader = at.sidebar.file_uploader(key="checkpoint_upload")
    for upload, message in cases:
        at = uploader.set_value(upload).run()
        assert message in errors(at), upload[0]
        assert not [box for box in at.sidebar.selectbox if box.key == "pth_arch"], upload[0]
        uploader = at.sidebar.file_uploader(key="checkpoint_upload")
    assert not (tmp_path / "pwned.txt").exists()
    data = (dev_folder / "a_p4cnn_dev.safetensors").read_bytes()
    at = ok(uploader.set_value(("mine.safetensors", data, "application/octet-stream")).run())
    assert any("mine.safetensors" in m.value for m in at.markdown)


def test_pth_architecture_comes_from_its_weights_with_a_picker_only_where_two_fit(dev_folder, monkeypatch):
    at = app(monkeypatch, dev_folder)
    at = ok(at.sidebar.radio(key="model_source").set_value("Upload a checkpoint").run())
    weights = io.BytesIO()
    torch.manual_seed(1)
    torch.save(models.build_model("p4cnn").state_dict(), weights)
    upload = ("model.pth", weights.getvalue(), "application/octet-stream")
    at = ok(at.sidebar.file_uploader(key="checkpoint_upload").set_value(upload).run())
    assert not [box for box in at.sidebar.selectbox if box.key == "pth_arch"]
    assert "Architecture, from its weights: **p4cnn**." in [c.value for c in at.sidebar.caption]
    assert ("<small>**model.pth** · p4cnn · p4 · rot_mnist · the paper's log: test error 2.14 % (selected on the test "
            "set)</small>") in at.markdown[1].value

    monkeypatch.setitem(registry._REGISTRY, "p4cnn_twin", registry._REGISTRY["p4cnn"])
    twin = io.BytesIO()
    torch.manual_seed(2)  # other bytes: the fits of the first upload are cached by its digest
    torch.save(models.build_model("p4cnn").state_dict(), twin)
    upload = ("twin.pth", twin.getvalue(), "application/octet-stream")
    at = ok(at.sidebar.file_uploader(key="checkpoint_upload").set_value(upload).run())
    assert at.sidebar.selectbox(key="pth_arch").options == ["p4cnn", "p4cnn_twin"]


def test_exports(dev_folder):
    from app.pictures.arrows import arrow_field
    from app.pictures.export import export_npz
    from app.ui.views import Display, arrows_png, maps_png

    model, card = models.load_checkpoint(dev_folder / "a_p4cnn_dev.safetensors")
    image = np.asarray(Image.open(list_gallery(kind="digit")[0].path), dtype=np.float32)[None] / 255
    result = analyse(model, card, image)
    layer = result.attention["c2"]
    field = arrow_field(layer, 28)
    assert maps_png(result, layer, Display(), (0.0, 1.0)).startswith(b"\x89PNG")
    assert maps_png(result, layer, Display(range_mode="deviation"), (-0.1, 0.1), border=2).startswith(b"\x89PNG")
    assert arrows_png(field, result, 1).startswith(b"\x89PNG")
    arrays, metadata = read_npz(export_npz(result, None, field, "attention/c2", {"model": "a_p4cnn_dev"}))
    assert arrays["attention/c2/maps"].shape == layer.maps.shape and metadata["extra"]["model"] == "a_p4cnn_dev"


@pytest.mark.skipif(not (REPO / "checkpoints" / "z2cnn_rot_mnist.safetensors").exists(), reason="z2cnn not shipped")
def test_plain_versus_equivariant_tab_on_a_digit(monkeypatch):
    at = open_tab(select_model(ok(app(monkeypatch, REPO / "checkpoints")), "a_p4cnn"), "Plain CNN vs equivariant")
    at = ok(at.radio(key="compare_element").set_value(1).run())
    deviations = {m.label: float(m.value) for m in at.metric if m.label.startswith("Deviation")}
    assert deviations["Deviation, a_p4cnn_rot_mnist"] < 1e-5
    assert deviations["Deviation, z2cnn_rot_mnist"] > 0.1
    # On an H&E model the digit models cannot see the patch: the tab says so instead.
    at = open_tab(select_model(at, "fa_p4m_densenet"), "Plain CNN vs equivariant")
    assert any("which take 28 x 28 grey images" in i.value for i in at.info)


@pytest.mark.skipif(not PCAM_MODEL.exists(), reason="the shipped PCam checkpoint is absent")
def test_the_first_layer_shown_is_the_first_oriented_one_that_is_not_nearly_flat():
    from app.analysis.images import fit_to_model
    from app.ui.views import FLAT_SPAN, default_layer_key, layer_of

    model, card = models.load_checkpoint(PCAM_MODEL)
    image = fit_to_model(read_image((REPO / "app/gallery/pcam_tumour_0a5f22f6a5.jpg").read_bytes()), 96, 3).pixels
    analysis = analyse(model.eval(), card, image)
    # Its second and third attention layers remove about 1e-4: nearly flat maps, skipped.
    assert default_layer_key(analysis) == "attention/block_layers.1.conv"
    for skipped in ("attention/block_layers.0.conv", "attention/trans_layers.0.conv"):
        low, high = np.percentile(layer_of(analysis, skipped).maps[0], [2, 98])
        assert high - low < FLAT_SPAN
