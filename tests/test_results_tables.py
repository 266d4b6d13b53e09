"""The results tables of the cards (``experiments.results_tables``): what a card changed in its recipe, and the
binary tasks' metrics with their 95 % intervals."""

from __future__ import annotations

import dataclasses
import json

from experiments.results_tables import interval_table, recipe_changes
from training.presets import recipe


def test_report_names_what_a_card_changed_in_its_recipe():
    config = dataclasses.asdict(recipe("rot_mnist", "z2cnn"))
    assert recipe_changes({"preset": "rot_mnist", "config": config}) == "-"
    config.update(augment="rotate", cosine=True, train_on_valid=True, select_on="last", epochs=12, seed=3,
                  data_dir="elsewhere", milestones=[], lr=1e-3)
    assert recipe_changes({"preset": "rot_mnist", "config": config}) == (
        "cosine, augment=rotate, select_on=last, train_on_valid")  # not epochs (own column), seed or data_dir
    assert recipe_changes({"preset": "he_demo", "config": config}) == "preset he_demo retired"


def test_interval_table_lists_cards_with_intervals_beside_table_3(tmp_path):
    interval = {"value": 0.85, "low": 0.75, "high": 0.91}
    intervals = {name: interval for name in ("accuracy", "error", "auc", "nll", "ece")}
    card = {"arch": "fa_p4m_densenet", "dataset": {"name": "pcam_subset"}, "training": {"best_epoch": 7,
            "epochs_completed": 20}, "metrics": {"test_count": 79, "valid_nll": 0.47, "valid_auc": 0.861,
                                                 "test_intervals": intervals},
            "group": "p4m", "equivariance_error": {"max_relative_logit_error": 2.4e-7}}
    (tmp_path / "fa.json").write_text(json.dumps(card))
    (tmp_path / "no_intervals.json").write_text(json.dumps({**card, "metrics": {"test_count": 3}}))
    table = interval_table(tmp_path).splitlines()
    assert len(table) == 3
    assert table[2] == ("| fa_p4m_densenet | `fa` | 0.470 / 0.861 | 79 | 85.0 [75.0, 91.0] | 85.0 [75.0, 91.0] | 10.88 "
                        "| 0.850 [0.750, 0.910] | 0.850 [0.750, 0.910] | 0.850 [0.750, 0.910] | 2e-07 | 7 of 20 |")
