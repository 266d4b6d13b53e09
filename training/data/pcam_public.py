"""34,673 real PCam patches in PCam's own splits (``../shared/data/pcam_public``), decoded once and cached.

The folder holds ``labels.csv`` (``file,label,split,encoding,...,near_uniform,source_repo,...``; its README says
where every patch comes from) and the JPEGs it names under ``train/``, ``valid/`` and ``test/``: 29,822, 2,907
and 1,944 patches of PCam's training, validation and test splits, 96x96 RGB, label 1 when the central 32x32
pixels hold tumour.

Decoding 34,673 JPEGs takes about half a minute on two cores, and an hour-long epoch should not wait on it
every time a run starts or resumes: the decoded patches are written once to ``cache_root()/pcam_public`` as one
uint8 ``.npy`` (about 960 MB) named by a hash of ``labels.csv`` and of every listed file's size and modification
time, so that a changed folder is decoded again and a stale cache is never read. Loading the cache takes about
a second; everything is then held in memory as uint8.

Normalisation comes from the training split (per-channel mean and standard deviation of its pixels in [0, 1]),
not from the paper's constants: the JPEG copies' colours are this set's own.
"""

from __future__ import annotations

import csv
import hashlib
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.cpu.user_cache import cache_root

from .base import ArraySplit, DataError, Splits
from .pcam import LABEL_NOTE, SIZE, pcam_spec, read_patch

__all__ = ["load_pcam_public", "read_labels", "PatchRecord", "PublicSplit", "decode_all", "CACHE_FORMAT"]

SPLITS = ("train", "valid", "test")
REQUIRED_COLUMNS = ("file", "label", "split", "encoding", "near_uniform", "source_repo")
# Bumped whenever what the cache holds changes, so that an old cache is never read as a new one.
CACHE_FORMAT = 1


@dataclass(frozen=True)
class PatchRecord:
    """One row of ``labels.csv``."""

    file: str
    label: int
    split: str
    encoding: str
    near_uniform: bool
    source_repo: str


class PublicSplit(ArraySplit):
    """One split in memory, with each patch's file name, encoding and near-uniform flag (in the split's order).

    Args:
        images: uint8 ``(N, 3, 96, 96)``.
        records: the ``N`` rows of ``labels.csv`` the images were read from.
    """

    def __init__(self, images: np.ndarray, records: list[PatchRecord]):
        super().__init__(images, np.array([r.label for r in records], dtype=np.int64))
        self.names = tuple(r.file for r in records)
        self.encodings = tuple(r.encoding for r in records)
        self.near_uniform = np.array([r.near_uniform for r in records], dtype=bool)


def read_labels(root: Path) -> list[PatchRecord]:
    """The rows of ``root/labels.csv``, checked.

    Raises:
        DataError: a missing folder or file, a header without the needed columns, a label other than 0/1, a split
            other than train/valid/test, or a file named twice; the message names the file and line.
    """
    labels_file = root / "labels.csv"
    if not root.is_dir():
        raise DataError(f"PCam public folder {root} not found (expected labels.csv and train/, valid/, test/ in it)")
    if not labels_file.is_file():
        raise DataError(f"PCam public folder {root} has no labels.csv")
    try:
        with open(labels_file, newline="") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            columns = reader.fieldnames or []
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"cannot read {labels_file}: {e}") from e
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise DataError(f"{labels_file} lacks the column(s) {', '.join(missing)} (header: {','.join(columns)})")
    if not rows:
        raise DataError(f"{labels_file} lists no patches")
    records, seen = [], set()
    for line, row in enumerate(rows, start=2):
        where = f"{labels_file} line {line}"
        if row["label"] not in ("0", "1"):
            raise DataError(f"{where}: label must be 0 or 1, got {row['label']!r}")
        if row["split"] not in SPLITS:
            raise DataError(f"{where}: split must be one of {', '.join(SPLITS)}, got {row['split']!r}")
        if row["file"] in seen:
            raise DataError(f"{where}: {row['file']} is listed twice")
        seen.add(row["file"])
        records.append(PatchRecord(row["file"], int(row["label"]), row["split"], row["encoding"],
                                   row["near_uniform"] == "1", row["source_repo"]))
    return records


def _fingerprint(root: Path, records: list[PatchRecord]) -> str:
    """A hash of labels.csv and of every listed file's size and modification time; a missing file is a DataError."""
    digest = hashlib.sha256(f"format {CACHE_FORMAT}\n".encode())
    digest.update((root / "labels.csv").read_bytes())
    for record in records:
        path = root / record.file
        try:
            stat = path.stat()
        except OSError:
            raise DataError(f"PCam public image {path} not found (listed in {root / 'labels.csv'})") from None
        digest.update(f"{record.file} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:20]


def decode_all(root: Path, records: list[PatchRecord], threads: int | None = None) -> np.ndarray:
    """Every listed patch as uint8 ``(N, 3, 96, 96)``, in the order of ``records``.

    Pillow releases the GIL while it decodes, so a few threads decode in parallel.

    Raises:
        DataError: a missing, unreadable or misshapen image, named in the message.
    """
    out = np.empty((len(records), 3, SIZE, SIZE), dtype=np.uint8)

    def decode(i: int) -> None:
        out[i] = read_patch(root / records[i].file, "PCam public image").transpose(2, 0, 1)  # (96, 96, 3) -> (3, ...)

    with ThreadPoolExecutor(max_workers=threads or min(4, os.cpu_count() or 1)) as pool:
        list(pool.map(decode, range(len(records))))  # list(): re-raises the first DataError here
    return out


def _cached_images(root: Path, records: list[PatchRecord], cache: Path | None) -> np.ndarray:
    """The decoded patches, from the cache when it matches the folder, else decoded and (if allowed) cached."""
    if cache is None:
        return decode_all(root, records)
    path = cache / f"pcam_public-{_fingerprint(root, records)}.npy"
    if path.is_file():
        try:
            images = np.load(path)
            if images.shape == (len(records), 3, SIZE, SIZE) and images.dtype == np.uint8:
                return images
        except (OSError, ValueError, EOFError):
            pass  # a truncated or foreign file: decode again and replace it
    images = decode_all(root, records)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=cache, suffix=".npy.part", delete=False) as f:
            np.save(f, images)
        os.replace(f.name, path)  # atomic: a reader never sees half a cache
    except OSError:
        pass  # a read-only or full disk: the run goes on from memory, and decodes again next time
    return images


def _channel_stats(images: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of uint8 ``(N, 3, H, W)`` pixels taken as [0, 1], exactly (integer sums)."""
    count = images.shape[0] * images.shape[2] * images.shape[3]
    sums = np.zeros(3, dtype=np.float64)
    squares = np.zeros(3, dtype=np.float64)
    for start in range(0, len(images), 2048):  # chunks: int64 squares of the whole split would take 2 GB
        chunk = images[start:start + 2048].astype(np.int64)
        sums += chunk.sum(axis=(0, 2, 3))
        squares += (chunk * chunk).sum(axis=(0, 2, 3))
    mean = sums / count
    std = np.sqrt(squares / count - mean**2)
    return tuple(round(float(m) / 255, 4) for m in mean), tuple(round(float(s) / 255, 4) for s in std)


def _source(records: list[PatchRecord], root: Path) -> str:
    counts = {split: sum(r.split == split for r in records) for split in SPLITS}
    repos: dict[str, int] = {}
    for r in records:
        repos[r.source_repo] = repos.get(r.source_repo, 0) + 1
    largest = sorted(repos.items(), key=lambda item: -item[1])[:3]
    return (f"PatchCamelyon (PCam; Veeling et al. 2018, CC0), {len(records):,} real patches in PCam's own splits "
            f"({counts['train']:,} train / {counts['valid']:,} valid / {counts['test']:,} test) from public "
            f"repositories ({', '.join(f'{name}: {n:,}' for name, n in largest)}, {len(repos) - 3} smaller; "
            f"{root.name}/labels.csv names each patch's source), de-duplicated, disjoint from pcam_subset; all JPEG "
            f"({sum(r.encoding == 'jpeg_original' for r in records):,} as committed, about quality 75; the rest "
            f"re-encoded at quality 90 from lossless copies)")


def load_pcam_public(root: Path, cache: Path | None | str = "default") -> Splits:
    """Read the folder's three splits into memory (through the decoded cache).

    Args:
        root: the folder holding ``labels.csv`` and ``train/``, ``valid/``, ``test/``.
        cache: folder of the decoded cache; ``"default"`` is ``cache_root()/pcam_public``; None decodes every time.

    Returns:
        Splits of :class:`PublicSplit` (uint8 held, float32 ``(B, 3, 96, 96)`` in [0, 1] handed out), labels 1 for
        tumour; the spec's mean and std are the training split's, its ``test_files`` the test patches in order.

    Raises:
        DataError: a missing folder, labels file or image, a corrupt or misshapen image, a bad label or split,
            named in the message.
    """
    root = Path(root)
    records = read_labels(root)
    if cache == "default":
        cache = cache_root() / "pcam_public"
    images = _cached_images(root, records, None if cache is None else Path(cache))
    splits = {}
    for split in SPLITS:
        index = [i for i, r in enumerate(records) if r.split == split]
        if not index:
            raise DataError(f"{root / 'labels.csv'} lists no {split} patches")
        splits[split] = PublicSplit(images[index], [records[i] for i in index])
    del images  # the splits hold their own copies
    mean, std = _channel_stats(splits["train"].images)
    spec = pcam_spec("pcam_public", _source(records, root), mean=mean, std=std, test_files=splits["test"].names,
                     notes=f"{LABEL_NOTE}. Test = a random sample of PCam's test split (1,944 of 32,768) as JPEG "
                           "copies, where the paper's Table 3 used all of it losslessly: compare with its 95 % "
                           "interval")
    return Splits(spec=spec, **splits)

