"""``python -m experiments``: the paper's tables from the runs' cards and records, and what they write back.

    python -m experiments report checkpoints                                  # results table of the cards
    python -m experiments report results/pcam_public --intervals             # with 95 % intervals
    python -m experiments report results/rot_mnist --seeds                    # Table 1: mean +- std over seeds
    python -m experiments report results/rot_mnist --claims                   # the paper's claims on our seeds
    python -m experiments report results/rot_mnist --readme README.md         # both, rewritten into the README
    python -m experiments report results/rot_mnist --seeds --write-cards checkpoints  # Table 1 into the cards
    python -m experiments table3 results/pcam_table3 --runs-dir ../runs       # Table 3 and its paired claims
    python -m experiments table3 --seeds --write                              # Table 3 over seeds, into the docs
    python -m experiments intervals checkpoints/fa_p4m_densenet_pcam.json     # a card's intervals from its record

The runs themselves come from ``python -m training`` (train, sweep); nothing here trains. The cards and records
made before these commands moved here name them as ``python -m experiments report|table3|intervals ...``, the
form they had then; that form still runs them (``training/__main__.py`` runs this command in a process of its own,
importing nothing of it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from models import CheckpointError
from training.data import DataError

from . import table3
from .card_records import interval_changes, rerecord_intervals
from .generated_blocks import refresh_readme
from .results_tables import interval_table, results_table, seed_table
from .table1_cards import write_table1_cards
from .table1_claims import claims_table

__all__ = ["COMMANDS", "build_parser", "main"]

# The subcommands; ``python -m training`` runs these under their former names (training.cli.MOVED, the same ones).
COMMANDS = ("report", "table3", "intervals")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m experiments", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    report = commands.add_parser("report", help="markdown table of the checkpoints' cards beside the paper")
    report.add_argument("folder", nargs="?", default="checkpoints")
    report.add_argument("--intervals", action="store_true",
                        help="binary tasks: every card in the folder with its metrics' 95 %% intervals")
    report.add_argument("--seeds", action="store_true",
                        help="one row per model: test error mean +- std over the seeds' cards, beside the paper")
    report.add_argument("--claims", action="store_true",
                        help="the paper's Table 1 claims, each tested on the seeds' cards (permutation test)")
    report.add_argument("--write-cards", metavar="CHECKPOINTS",
                        help="with --seeds: put each architecture's row into the cards of its checkpoints there")
    report.add_argument("--readme", metavar="README",
                        help="rewrite this markdown file's seeds and claims tables from the cards, in place")

    table3.add_arguments(commands.add_parser(
        "table3", help="Table 3 (PCam): the sweep's models and the paper's release on the same test patches, "
                       "with the paper's claims as paired tests"))

    intervals = commands.add_parser("intervals", help="record a card's 95 %% test intervals again from its "
                                    "per-patch test record, or from the weights beside it (experiments.card_records)")
    intervals.add_argument("cards", nargs="+", metavar="CARD")
    intervals.add_argument("--dry-run", action="store_true", help="print how the intervals change; write nothing")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.command == "report":
        return _report(args)
    if args.command == "table3":
        return table3.run(args)
    return _intervals(args)


def _report(args: argparse.Namespace) -> int:
    """Print a table of the cards, or write Table 1 into the README or the cards."""
    if args.readme:
        try:
            changed = refresh_readme(args.readme, args.folder)
        except (OSError, ValueError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(f"{args.readme}: tables {'rewritten from' if changed else 'already match'} {args.folder}")
        return 0
    if args.write_cards:
        if not args.seeds:
            print("error: --write-cards goes with --seeds", file=sys.stderr)
            return 2
        try:
            written = write_table1_cards(args.folder, args.write_cards)
        except (OSError, CheckpointError, ValueError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(f"{args.write_cards}: Table 1 rows written into {', '.join(written) if written else 'no card'}")
        return 0
    table = (claims_table if args.claims else seed_table if args.seeds else interval_table if args.intervals
             else results_table)
    print(table(args.folder))
    return 0


def _intervals(args: argparse.Namespace) -> int:
    """Each card's intervals again, and how far their bounds moved."""
    failed = 0
    for card in args.cards:
        try:
            old, new = rerecord_intervals(Path(card), write=not args.dry_run)
        except (OSError, ValueError, CheckpointError, DataError) as error:
            print(f"error: {error}", file=sys.stderr)
            failed += 1
            continue
        print(f"{card}: {interval_changes(old, new)}")
    return 1 if failed else 0
