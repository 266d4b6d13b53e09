"""Files written whole or not at all, so that a reader (or a training started meanwhile) never sees half a file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_file", "write_atomic"]


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A binary file handle whose contents replace ``path`` only once it is completely written.

    The temporary file lies beside ``path`` (same file system, so the rename is atomic) and is removed on error.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename, so a power cut leaves the old file or the new one
        os.chmod(tmp, 0o644)  # mkstemp makes 0600 files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` by ``data`` through :func:`atomic_file`."""
    with atomic_file(path) as f:
        f.write(data)
