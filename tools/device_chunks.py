"""Stage a data folder for a lent GPU machine in pieces that each fit one call's working tree.

    python -m tools.device_chunks ../shared/data/pcam_public            # writes .gpu/p1 ... .gpu/pN
    python -m tools.device_chunks --clean                                # removes .gpu/ again

The device tool sends the checkout, not ``../shared`` beside it, and at most 64 MiB a call, counted as the
transfer packs it (a 512-byte header and padding per file: 34,673 JPEGs of 4.8 KiB weigh about 40 % more than
their bytes). So a folder larger than that travels in several calls, one piece each, while the machine stays
warm (it goes back 30 s after a call): ``carry: [".gpu/pK"]`` and ``cp -r .gpu/pK/. /tmp/DATA/`` on the machine.
PCam's 166 MiB went in five such calls, about 5 s of device time each (2026-11-27).

The pieces are copies under ``.gpu/``, which this adds to ``.git/info/exclude``: never committed, and removed
with ``--clean`` once the machine is given back.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAGE = REPO / ".gpu"
TAR_BLOCK = 512


def packed_size(path: Path) -> int:
    """Bytes a file takes in a tar stream: a header block, then its bytes padded to whole blocks."""
    return TAR_BLOCK + -(-path.stat().st_size // TAR_BLOCK) * TAR_BLOCK


def tracked_size() -> int:
    """Packed bytes of the files git tracks (they travel with every call)."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return sum(packed_size(REPO / n) for n in names.decode().split("\0") if n and (REPO / n).is_file())


def plan_pieces(files: list[tuple[str, int]], budget: int) -> list[list[str]]:
    """Files (relative name, packed size) in order, cut into consecutive pieces of at most ``budget`` bytes."""
    pieces: list[list[str]] = [[]]
    used = 0
    for name, size in files:
        if size > budget:
            raise ValueError(f"{name} alone ({size} bytes packed) is larger than a piece ({budget} bytes)")
        if used + size > budget:
            pieces.append([])
            used = 0
        pieces[-1].append(name)
        used += size
    return pieces


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.device_chunks", description=__doc__.split("\n")[0])
    parser.add_argument("folder", nargs="?", help="the data folder to stage")
    parser.add_argument("--limit-mib", type=float, default=64.0, help="one call's working tree")
    parser.add_argument("--spare-mib", type=float, default=8.0,
                        help="left free for untracked files (50 MiB in all went through; 67 did not)")
    parser.add_argument("--clean", action="store_true", help="remove the staged pieces")
    args = parser.parse_args(argv)
    if args.clean:
        shutil.rmtree(STAGE, ignore_errors=True)
        print(f"removed {STAGE.relative_to(REPO)}/")
        return 0
    if not args.folder:
        parser.error("name the folder to stage (or --clean)")
    folder = Path(args.folder)
    if not folder.is_dir():
        parser.error(f"{folder} is not a folder")
    exclude = REPO / ".git" / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    if "/.gpu/" not in (exclude.read_text().split() if exclude.exists() else []):
        with exclude.open("a") as f:
            f.write("/.gpu/\n")
    budget = int((args.limit_mib - args.spare_mib) * 2**20) - tracked_size()
    files = [(str(p.relative_to(folder)), packed_size(p)) for p in sorted(folder.rglob("*")) if p.is_file()]
    pieces = plan_pieces(files, budget)
    shutil.rmtree(STAGE, ignore_errors=True)
    for number, piece in enumerate(pieces, start=1):
        target = STAGE / f"p{number}"
        for name in piece:
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(folder / name, target / name)
        print(f".gpu/p{number}: {len(piece)} files")
    print(f"{len(files)} files in {len(pieces)} pieces of at most {budget / 2**20:.1f} MiB packed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
