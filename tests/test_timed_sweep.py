"""The GPU sweep's plan: every run a valid training command, and epochs fitted to the time left."""

from __future__ import annotations

import pytest

from training.cli import build_parser, config_from_args
from training.presets import recipe
from training.timed_sweep import COMMON, MAX_EPOCHS, RUNS, epochs_that_fit


@pytest.mark.parametrize("name", sorted(RUNS))
def test_every_run_is_a_valid_pcam_public_command(name):
    cfg = config_from_args(build_parser().parse_args(["train", "pcam_public", *COMMON, *RUNS[name]]))
    assert cfg.model == "fa_p4m_densenet" and cfg.dataset == "pcam_public"
    assert cfg.cosine, "each run's schedule is one cosine cycle, fitted to the budget"
    assert cfg.init_from is None or cfg.init_from.startswith("checkpoints/")


def test_epochs_fit_the_time_left_with_a_margin():
    preset = recipe("pcam_public")
    args = dict(batch_size=preset.batch_size, epoch_size=preset.epoch_size, valid_size=2907,  # the validation split
                eval_batch_size=preset.eval_batch_size)
    steps = -(-7456 // 64) + -(-2907 // 128)  # 117 training steps and 23 validation batches an epoch
    # 0.32 s a step (four runs at once on an H200): 45.8 s an epoch, 52.7 s with the 15 % margin.
    assert epochs_that_fit(0.32, 500.0, **args) == int(500 / (1.15 * (steps * 0.32 + 1)))  # 9
    assert epochs_that_fit(0.32, 500.0, **args) * 1.15 * (steps * 0.32 + 1) <= 500
    assert epochs_that_fit(10.0, 5.0, **args) == 1, "at least one epoch, even when none fits"
    assert epochs_that_fit(1e-6, 1e6, **args) == MAX_EPOCHS
