"""Record what each shipped PCam checkpoint predicts on every test patch of ``pcam_public``.

    python -m benchmarks.pcam_test_record [STEM ...] [--threads 2]

Measures ``checkpoints/{stem}.safetensors`` (no stem named: every ``*_pcam`` checkpoint) on all 1,944 test
patches of ``../shared/data/pcam_public`` (the card's data_dir) and writes ``results/pcam_test_predictions/
{stem}.json``, the record ``tests/test_shipped_checkpoints.py`` holds the checkpoint and its card to: the
checkpoint's sha256, the data's identity (test files and labels, decoded images), each patch's tumour probability
(the softmax's float32, as the shortest decimal that reads back to the same float32) and the card's metrics
recomputed from those probabilities. Measuring them takes minutes on two cores; the test reads them and recomputes
a seeded random sample of patches.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from experiments.patch_records import data_identity, prediction_record, write_record
from models import load_checkpoint
from training.data import load_dataset

REPO = Path(__file__).resolve().parents[1]
RECORDS = REPO / "results" / "pcam_test_predictions"
RECORD_COMMAND = "python -m benchmarks.pcam_test_record"


def shipped() -> list[Path]:
    return sorted((REPO / "checkpoints").glob("*_pcam.safetensors"))


def record_path(stem: str) -> Path:
    return RECORDS / f"{stem}.json"


def record(path: Path, test, identity: dict, threads: int) -> dict:
    result = prediction_record(
        path, test, identity, threads=threads, shown_as=str(path.relative_to(REPO)),
        what=f"{path.stem}'s tumour probability on each of the {len(test)} test patches of pcam_public "
             "(tests/test_shipped_checkpoints.py holds the checkpoint and its card to it)",
        how_made=f"{RECORD_COMMAND} (this checkpoint alone: {RECORD_COMMAND} {path.stem})")
    RECORDS.mkdir(parents=True, exist_ok=True)
    out = record_path(path.stem)
    write_record(out, result)
    m = result["metrics"]
    print(f"{path.stem}: error {m['error']:.4f}, AUC {m['auc']:.4f}, NLL {m['nll']:.4f}, ECE {m['ece']:.4f} "
          f"({result['machine'].rsplit('; ', 1)[-1]}) -> {out.relative_to(REPO)}", flush=True)
    return result


def main() -> None:
    stems = [path.stem for path in shipped()]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stems", nargs="*", metavar="STEM", help=f"of {', '.join(stems)} (none named: all)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    args = parser.parse_args()
    if set(args.stems) - set(stems):
        parser.error(f"no shipped PCam checkpoint {', '.join(sorted(set(args.stems) - set(stems)))}")
    torch.set_num_threads(args.threads)
    loaded = {}  # data_dir -> (test split, its identity): the cards name one folder, read once
    for stem in args.stems or stems:
        path = REPO / "checkpoints" / f"{stem}.safetensors"
        data_dir = load_checkpoint(path)[1]["training"]["config"]["data_dir"]
        if data_dir not in loaded:
            test = load_dataset("pcam_public", REPO / data_dir).test
            loaded[data_dir] = test, data_identity(test)
        record(path, *loaded[data_dir], args.threads)


if __name__ == "__main__":
    main()
