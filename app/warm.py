"""``python -m app.warm``: what the app would otherwise compute for its first visitor, computed before it starts.

For every checkpoint in ``$APP_CHECKPOINTS`` (default ``checkpoints/``), the padding borders of its layers
(:func:`app.analysis.padding.stored_borders`: four analyses of constant images each, 2.6 s for the PCam DenseNet
on two cores), stored under the user's cache, where the app reads them. ``make run`` runs it before the server;
the Docker image runs it when it is built, so that a container's first page needs none of it.
"""

from __future__ import annotations

import sys
import time

from models import load_checkpoint

from .analysis.checkpoints import checkpoint_folder, list_checkpoints
from .analysis.padding import stored_borders


def main() -> int:
    entries = list_checkpoints(checkpoint_folder())
    for entry in entries:
        if entry.error:
            continue
        start = time.perf_counter()
        model, card = load_checkpoint(entry.path)
        stored_borders(model, card)
        print(f"{entry.name}: padding borders ready ({time.perf_counter() - start:.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
