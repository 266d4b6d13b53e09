"""Streamlit inputs of the app: model, image, transform. Each ``*_ui()`` draws widgets and returns their values.

Models are loaded once per process with ``st.cache_resource`` (eval mode, never
modified afterwards; maps come out of the forward pass, nothing is stored on
the module), keyed by the checkpoint's path and modification time, or by the
upload's SHA-256. Decoded uploads and analyses live in small LRU caches
(:mod:`app.analysis.cache`). Every bad file ends in ``st.error`` with the message of its
:class:`~app.analysis.images.ImageError` or :class:`~models.CheckpointError`, and the
function returns None so that the page says what to do instead of failing.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import streamlit as st

from models import Group, Network, load_checkpoint

from ..analysis.cache import LRUCache, image_digest
from ..analysis.checkpoints import (
    CheckpointEntry,
    CheckpointError,
    by_dataset,
    checkpoint_folder,
    list_checkpoints,
    load_uploaded_checkpoint,
    upload_architectures,
)
from ..analysis.images import FORMATS, MAX_UPLOAD_BYTES, FitInfo, ImageError, fit_to_model, read_image, to_channels
from ..analysis.pathology import is_pathology, is_proxy
from ..analysis.variants import attention_kind
from ..gallery import list_patches

__all__ = ["LoadedModel", "ChosenImage", "default_checkpoint", "model_ui", "image_ui", "transform_ui",
           "checkpoint_folder", "load_entry", "checkpoint_key", "gallery_order", "decoded", "NO_CHECKPOINT_HELP"]

REGION_CELL_KEY = "region_cell"  # a cell the slide page hands over (RegionCell)
REGION_CELL_SOURCE = "Cell from the slide"


@dataclass(frozen=True)
class RegionCell:
    """A cell of a slide or image sent to the patch explorer: its 96 x 96 context at the model's scale, read as the
    engine judged it, and its true label where the slide knows it."""

    pixels: np.ndarray
    name: str
    microns_per_pixel: float
    true_label: str | None
IMAGE_TYPES = ["png", "jpg", "jpeg", "tif", "tiff", "bmp", "webp"]
NO_CHECKPOINT_HELP = """**No model checkpoint found** in `{folder}/`.

* Upload one in the sidebar: one of ours (`.safetensors`, its model card embedded) or a `.pth` released with
  the paper's code (its architecture is found from its weights), or
* train one: `python -m training train rot_mnist --model a_p4cnn --fetch`, then copy
  `runs/rot_mnist-a_p4cnn-seed0/best.safetensors` (and `best.json`) to `{folder}/a_p4cnn_rot_mnist.safetensors`
  (`.json`). Set `APP_CHECKPOINTS` to list another folder.
"""


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to analyse: ``model_id`` keys the caches, ``name`` is what the user picked, ``path`` its file
    on the server (None for an upload, held in memory only)."""

    model_id: str
    name: str
    model: Network
    card: dict
    path: Path | None = None


@dataclass(frozen=True)
class ChosenImage:
    """The fitted image (``(C, S, S)`` in [0, 1]), where it came from and its true label (gallery only)."""

    pixels: np.ndarray
    info: FitInfo
    source: str
    microns_per_pixel: float | None
    true_label: str | None = None


@st.cache_resource(max_entries=8, show_spinner="Loading the model ...")
def _load_listed(path: str, mtime_ns: int) -> tuple[Network, dict]:
    del mtime_ns  # part of the cache key only: a replaced file is loaded again
    print(f"loaded checkpoint {path}", file=sys.stderr, flush=True)  # counted by benchmarks.concurrent_sessions
    return load_checkpoint(path)


@st.cache_resource(max_entries=4, show_spinner="Loading the uploaded checkpoint ...")
def _load_upload(digest: str, filename: str, arch: str | None, _data: bytes) -> tuple[Network, dict]:
    del digest  # the key; the bytes themselves are not hashed again
    return load_uploaded_checkpoint(_data, filename, arch)


@st.cache_resource(max_entries=4)
def _upload_fits(digest: str, filename: str, _data: bytes) -> list[str]:
    del digest  # the key
    return upload_architectures(_data, filename)


@st.cache_resource
def decoded_images() -> LRUCache:
    """Decoded uploads by SHA-256 of their bytes (one process-wide LRU)."""
    return LRUCache(maxsize=4)


def default_checkpoint(entries: list) -> int:
    """Index of the checkpoint the app opens with: of the H&E models trained on real tumour labels, an attentive
    one (what the app is about) with the lowest test error, else the first checkpoint."""
    candidates = [(attention_kind(entry.card) == "none",
                   math.inf if entry.test_error is None else entry.test_error, index)
                  for index, entry in enumerate(entries)
                  if entry.card and is_pathology(entry.card) and not is_proxy(entry.card)]
    return min(candidates)[2] if candidates else 0


def load_entry(entry: CheckpointEntry) -> LoadedModel:
    """A listed checkpoint, loaded once per process (and again only when its file changes).

    Raises:
        CheckpointError, OSError: an unreadable checkpoint.
    """
    mtime_ns = entry.path.stat().st_mtime_ns
    model, card = _load_listed(str(entry.path), mtime_ns)
    return LoadedModel(f"{entry.path.resolve()}@{mtime_ns}", entry.name, model, card, entry.path.resolve())


def _pick_checkpoint(entries: list[CheckpointEntry]) -> CheckpointEntry:
    """Sidebar: the dataset (when the folder holds models of several), then a checkpoint trained on it.

    Grouping keeps a dozen rot-MNIST variants from burying the H&E models; the app opens on the default checkpoint
    (:func:`default_checkpoint`) and its dataset.
    """
    default = entries[default_checkpoint(entries)]
    groups = by_dataset(entries, default)
    if len(groups) > 1:
        title = st.sidebar.radio("Dataset", list(groups), horizontal=True, key="dataset",
                                 help="Checkpoints are listed by the data they were trained on.")
    else:
        title = next(iter(groups))
    by_name = {e.name: e for e in groups[title]}
    names = list(by_name)
    # One picker per dataset: a keyed widget whose options change keeps showing its old choice in the browser,
    # and going back to a dataset finds the model picked there before.
    name = st.sidebar.selectbox("Checkpoint", names, format_func=lambda n: by_name[n].label,
                                index=names.index(default.name) if default.name in by_name else 0,
                                key=checkpoint_key(title))
    return by_name[name]


def checkpoint_key(dataset_title: str) -> str:
    """The widget key of the checkpoint picker of a dataset (e.g. ``"checkpoint-rot-MNIST"``)."""
    return f"checkpoint-{dataset_title}"


def model_ui(folder: Path) -> LoadedModel | None:
    """Sidebar: a shipped checkpoint or an uploaded one. None (after a message) when there is no usable model."""
    entries = list_checkpoints(folder)
    st.sidebar.header("Model")
    source = st.sidebar.radio("Source", ["Shipped checkpoints", "Upload a checkpoint"], index=0 if entries else 1,
                              horizontal=True, key="model_source")
    if source == "Shipped checkpoints":
        if not entries:
            st.info(NO_CHECKPOINT_HELP.format(folder=folder))
            return None
        entry = _pick_checkpoint(entries)
        if entry.error:
            st.error(f"{entry.name}: {entry.error}")
            return None
        try:
            return load_entry(entry)
        except (CheckpointError, OSError) as err:
            st.error(f"Cannot load {entry.name}: {err}")
            return None
    upload = st.sidebar.file_uploader("Checkpoint file (.safetensors, or the paper's .pth)",
                                      type=["safetensors", "pth", "pt"], key="checkpoint_upload")
    if upload is None:
        st.info("Upload a checkpoint in the sidebar." + ("" if entries else "\n\n" + NO_CHECKPOINT_HELP.format(
            folder=folder)))
        return None
    data = upload.getvalue()
    digest = image_digest(data)
    try:
        arch = _pth_architecture(digest, upload.name, data)
        model, card = _load_upload(digest, upload.name, arch, data)
    except CheckpointError as err:
        st.error(f"Cannot use this checkpoint: {err}")
        return None
    return LoadedModel(f"upload:{digest}:{arch}", upload.name, model, card)


def _pth_architecture(digest: str, filename: str, data: bytes) -> str | None:
    """Sidebar, for a ``.pth``: the architecture its weights fit, with a picker only where several fit.
    None for our ``.safetensors`` files, whose cards name theirs.

    Raises:
        CheckpointError: an unreadable file, or weights that fit no registered architecture.
    """
    if Path(filename).suffix.lower() not in (".pth", ".pt"):
        return None
    fits = _upload_fits(digest, filename, data)
    if len(fits) == 1:
        st.sidebar.caption(f"Architecture, from its weights: **{fits[0]}**.")
        return fits[0]
    return st.sidebar.selectbox("Architecture of the .pth", fits, key="pth_arch",
                                help="Its weights fit each of these architectures: pick the one it was trained as.")


def image_ui(card: dict) -> ChosenImage | None:
    """Sidebar: a gallery image or an upload, fitted to the model (resize, or a crop at native scale)."""
    spec = card["input"]
    size, channels = int(spec["size"]), int(spec["channels"])
    st.sidebar.header("Image")
    cell = st.session_state.get(REGION_CELL_KEY)
    sources = ["Gallery", "Upload an image"] + ([REGION_CELL_SOURCE] if cell is not None else [])
    if st.session_state.get("image_source") not in sources:
        st.session_state.pop("image_source", None)
    source = st.sidebar.radio("Source", sources, horizontal=True, key="image_source")
    if source == REGION_CELL_SOURCE:
        st.sidebar.caption(f"{cell.name}: its 96 x 96 context at {cell.microns_per_pixel} um/px, as the slide's "
                           "analysis judged it.")
        info = FitInfo("crop", cell.pixels.shape[1:], (0, 0, size, size), size, (3, channels),
                       f"{cell.name}, the cell's 96 x 96 context from the slide.")
        return ChosenImage(to_channels(cell.pixels, channels), info, cell.name, cell.microns_per_pixel,
                           cell.true_label)
    if source == "Gallery":
        preferred, items = gallery_order(card)
        by_name = {i.name: i for i in items}
        item = by_name[st.sidebar.selectbox("Gallery image", list(by_name), format_func=lambda n: by_name[n].caption,
                                            key=f"gallery-{preferred}")]
        data, name, mpp, label = item.path.read_bytes(), item.name, item.microns_per_pixel, item.label
        st.sidebar.caption(f"{item.source}. {item.credit}.")
    else:
        upload = st.sidebar.file_uploader(f"Image ({', '.join(FORMATS)})", type=IMAGE_TYPES, key="image_upload",
                                          max_upload_size=MAX_UPLOAD_BYTES // 2**20)
        if upload is None:
            st.info("Upload an image in the sidebar, or pick one from the gallery.")
            return None
        data, name, mpp, label = upload.getvalue(), upload.name, None, None
    try:
        image = decoded(data)
    except ImageError as err:
        st.error(f"Cannot use {name}: {err}")
        return None
    rows, cols = image.shape[1:]
    can_crop = rows >= size and cols >= size
    mode = st.sidebar.radio("Fit to the model's input", ["resize", "crop"], horizontal=True, key="fit_mode",
                            help=f"The model takes {size} x {size} pixels with {channels} channel(s). Resize "
                                 "scales the centred square; crop cuts a window at native scale.",
                            disabled=not can_crop)
    origin = None
    if mode == "crop" and can_crop:
        origin = (st.sidebar.slider("Crop top row", 0, rows - size, (rows - size) // 2, key="crop_row")
                  if rows > size else 0,
                  st.sidebar.slider("Crop left column", 0, cols - size, (cols - size) // 2, key="crop_col")
                  if cols > size else 0)
    try:
        fitted = fit_to_model(image, size, channels, mode if can_crop else "resize", origin)
    except ImageError as err:
        st.error(f"Cannot fit {name}: {err}")
        return None
    if fitted.info.mode == "resize" and mpp is not None:
        mpp = mpp * fitted.info.region[2] / size
    return ChosenImage(fitted.pixels, fitted.info, name, mpp, label)


def gallery_order(card: dict) -> tuple[str, list]:
    """The kind of gallery image that suits ``card``'s model (``"he"`` or ``"digit"``) and the gallery's patches as
    its picker lists them, that kind first (regions are not model-sized patches: not listed)."""
    items = list_patches()
    preferred = "he" if is_pathology(card) or int(card["input"]["channels"]) == 3 else "digit"
    return preferred, [i for i in items if i.kind == preferred] + [i for i in items if i.kind != preferred]


def decoded(data: bytes) -> np.ndarray:
    """``data`` read as an image, once per process for the same bytes.

    Raises:
        ImageError: not an image this app reads.
    """
    return decoded_images().get_or_compute(image_digest(data), lambda: read_image(data))


def transform_ui(group: Group, planar: bool, turns: bool = True) -> tuple[int, float]:
    """Sidebar: the group element (quarter turns, mirror for p4m; only with ``turns``) and an extra arbitrary angle.

    Without ``turns`` the page turns and mirrors in its viewer, in the browser (:mod:`app.ui.turn_viewer`), and
    the element is the identity.

    Returns:
        ``(element index, degrees)``: the element is applied first, then the rotation by ``degrees``.
    """
    st.sidebar.header("Transform")
    quarter, mirror = 0, False
    if turns:
        quarter = st.sidebar.radio("Rotate by", [0, 90, 180, 270], format_func=lambda d: f"{d}°", horizontal=True,
                                   key=f"rotate-{group.name}")
        if group.order == 8:
            mirror = st.sidebar.toggle("Mirror (flip the rows after rotating)", key="mirror")
    else:
        st.sidebar.caption("Turn and mirror the image with the buttons above the maps: the page has every "
                           "transform's maps already and switches at once.")
    degrees = st.sidebar.slider("Rotate by an arbitrary angle" if not turns else "Then rotate by an arbitrary angle",
                                -180, 180, 0, step=1, key="angle")
    note = ("Only group elements (quarter turns, mirrors) give exact equivariance: other angles resample the "
            "pixels, so the maps follow only approximately; the measured deviation is shown with the proof.")
    if planar:
        note = "A planar CNN is not equivariant: the proof shows how far its maps are from it."
    st.sidebar.caption(note)
    return quarter // 90 + 4 * mirror, float(degrees)
