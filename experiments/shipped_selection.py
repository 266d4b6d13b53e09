"""Which run of the Table 3 recipe ships as each PCam checkpoint: the seed with the lowest validation NLL.

The recipe (preset ``pcam_table3``) chooses each run's epoch by validation NLL; the same rule, applied across the
runs of every seed, chooses the run that ships, so that test never chooses. The shipped card keeps the choice
(``selection``: the rule, the seed, every seed's validation NLL), and a test holds it to the results cards.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["SHIPPED", "RULE", "selection"]

# The architectures that ship, by checkpoint name (the planar DenseNet and p4 without attention do not).
SHIPPED = {"fa_p4m_densenet": "fa_p4m_densenet_pcam", "p4m_densenet": "p4m_densenet_pcam",
           "fa_p4_densenet": "fa_p4_densenet_pcam"}
RULE = ("the run with the lowest validation NLL (metrics.valid_nll: the recipe's own selection rule) among the "
        "finished runs of every seed of preset pcam_table3")


def selection(model: str, folders: dict[int, Path]) -> dict:
    """``{"rule", "seed", "valid_nll": {seed: NLL}}`` over the finished runs' cards in ``folders`` (seed -> folder).

    Raises:
        ValueError: no finished run of ``model``.
    """
    nll = {}
    for seed, folder in sorted(folders.items()):
        card = folder / f"{model}-seed{seed}.json"
        if card.is_file():
            run = json.loads(card.read_text())
            if run["training"]["epochs_completed"] == run["training"]["recipe_epochs"]:
                nll[str(seed)] = run["metrics"]["valid_nll"]
    if not nll:
        raise ValueError(f"no finished run of {model} in {', '.join(str(f) for f in folders.values())}")
    return {"rule": RULE, "seed": int(min(nll, key=nll.get)), "valid_nll": nll}
