"""Which run ships as each PCam checkpoint (``experiments.shipped_selection``): the card says so, and it is the run
the validation NLL chose among the seeds' results cards."""

from __future__ import annotations

import json

from experiments import shipped_selection
from experiments.table3_over_seeds import FOLDERS, REPO


def test_each_shipped_pcam_checkpoint_is_the_run_validation_chose_and_its_card_says_so():
    for model, shipped in shipped_selection.SHIPPED.items():
        ours = json.loads((REPO / "checkpoints" / f"{shipped}.json").read_text())
        chosen = shipped_selection.selection(model, {s: REPO / f for s, f in FOLDERS.items()})
        assert ours["selection"] == chosen, f"{shipped}: its card's selection is not what the results cards give"
        seed = chosen["seed"]
        run = json.loads((REPO / FOLDERS[seed] / f"{model}-seed{seed}.json").read_text())
        for part, key in (("training", "command"), ("training", "best_epoch"), ("metrics", "valid_nll"),
                          ("metrics", "test_auc")):
            assert ours[part][key] == run[part][key], f"{shipped} is not {model} seed {seed}: {part}.{key} differs"
