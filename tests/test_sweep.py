"""``python -m training sweep``: runs what is missing, resumes what was cut short, skips what is done."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_data_rot_mnist import write_amat

from experiments.results_tables import seed_table
from training import sweep as sweep_module
from training.cli import main as cli_main
from training.data.rot_mnist import AMAT_FILES
from training.sweep import SWEEPS, Sweep, run_sweep, sweep_status


@pytest.fixture
def tiny_sweep(tmp_path, monkeypatch):
    """A two-model, two-seed sweep of one-epoch runs on 60 amat digits, registered as ``tiny``."""
    data = tmp_path / "rot_mnist"
    data.mkdir()
    write_amat(data, n_train=60, n_test=20)
    sweep = Sweep(preset="rot_mnist", models=("z2cnn", "p4cnn"), seeds=(0, 1), results=str(tmp_path / "results"),
                  overrides={"data_dir": data, "epochs": 1, "batch_size": 16, "eval_batch_size": 16,
                             "equivariance_images": 2})
    monkeypatch.setitem(SWEEPS, "tiny", sweep)
    return sweep, tmp_path / "runs"


def test_table1_runs_the_shipped_models_over_every_seed_first():
    order = SWEEPS["table1"].order()
    assert order[:12] == [(m, s) for s in (0, 1, 2) for m in ("z2cnn", "p4cnn", "fa_p4cnn", "a_p4cnn")]
    assert len(order) == len(set(order)) == 30
    assert {m for m, _ in order} >= {"p4cnn", "arh_p4cnn", "big19_p4cnn", "a_p4cnn", "big15_p4cnn", "ach_p4cnn",
                                     "asp_p4cnn", "big11_p4cnn", "fa_p4cnn"}
    # Z2CNN keeps the 300 epochs of the paper's code; every P4CNN 100.
    assert SWEEPS["table1"].config("z2cnn").epochs == 300 and SWEEPS["table1"].config("a_p4cnn").epochs == 100


def test_shipped_recipe_sweeps_are_the_paper_recipe_with_rotations_and_a_cosine():
    paper = SWEEPS["table1"]
    folders = {sweep_module.run_folder(Path("runs"), paper, "p4cnn", 0)}
    final = {"train_on_valid", "select_on"}
    for name, extra in (("rotate_cosine", set()), ("rotate_cosine_12k", final), ("redraw_cosine", set()),
                        ("redraw_cosine_12k", final), ("redraw_cosine_e200", {"epochs"}),
                        ("redraw_cosine_e200_12k", final | {"epochs"})):
        sweep = SWEEPS[name]
        assert set(sweep.models) <= {"z2cnn", "p4cnn", "fa_p4cnn", "a_p4cnn"} and sweep.seeds == (0,)
        for model in sweep.models:
            changed = {k for k, v in sweep.config(model).__dict__.items() if v != getattr(paper.config(model), k)}
            assert changed == {"augment", "cosine"} | extra, (name, model)
        assert sweep.results != paper.results  # their cards never mix with the paper-recipe seeds
        folders.add(sweep_module.run_folder(Path("runs"), sweep, "p4cnn", 0))
    assert len(folders) == 7  # one runs folder can hold them all without one resuming another's run
    redraws = ("redraw_cosine", "redraw_cosine_12k", "redraw_cosine_e200", "redraw_cosine_e200_12k")
    assert {SWEEPS[name].config("p4cnn").augment for name in redraws} == {"redraw"}
    assert {SWEEPS[name].config(model).epochs for name in redraws[2:] for model in SWEEPS[name].models} == {200}


def test_train_command_passes_booleans_as_bare_flags(tmp_path):
    status = sweep_module.RunStatus("p4cnn", 0, tmp_path / "run", 0, 100, False)
    command = sweep_module.train_command(SWEEPS["rotate_cosine"], status, threads=1)
    assert command[command.index("--augment") + 1] == "rotate"
    assert "--cosine" in command and command[command.index("--cosine") + 1].startswith("--")
    assert "--resume" not in command  # nothing started yet
    off = Sweep(preset="rot_mnist", models=("p4cnn",), seeds=(0,), results="r", overrides={"cosine": False})
    with pytest.raises(ValueError, match="cosine=False cannot be passed"):
        sweep_module.train_command(off, status, threads=0)


def test_status_of_an_empty_runs_folder_lists_every_run_as_missing(tiny_sweep, capsys):
    sweep, runs = tiny_sweep
    assert cli_main(["sweep", "tiny", "--runs-dir", str(runs), "--status"]) == 0
    out = capsys.readouterr().out
    assert out.count("missing") == 4 and "0 of 4 runs done" in out
    assert not runs.exists()  # --status runs nothing


def test_runs_the_missing_skips_the_done_and_resumes_the_cut_short(tiny_sweep, monkeypatch):
    sweep, runs = tiny_sweep
    lines = []
    assert run_sweep("tiny", runs, seeds=(0,), log=lambda *a, **k: lines.append(a[0])) == 0
    cards = sorted((runs.parent / "results").glob("*.json"))
    assert [c.name for c in cards] == ["p4cnn-seed0.json", "z2cnn-seed0.json"]
    card = json.loads(cards[0].read_text())
    assert card["training"]["config"]["seed"] == 0 and card["training"]["provisional"] is False
    assert card["training"]["command"].startswith("python -m training train rot_mnist --model p4cnn --seed 0")
    assert "--out /" not in card["training"]["command"]  # the run folder relative to the working directory
    assert "| p4cnn | 24,610 | 0 | 1 |" in seed_table(runs.parent / "results")

    # Done runs are skipped: nothing is started.
    monkeypatch.setattr(sweep_module.subprocess, "Popen", lambda *a, **k: pytest.fail("started a done run"))
    assert run_sweep("tiny", runs, seeds=(0,), log=lambda *a, **k: None) == 0
    monkeypatch.undo()

    # A longer recipe makes the same runs cut short: they resume from their state, not from scratch.
    monkeypatch.setitem(SWEEPS, "tiny", Sweep(**{**sweep.__dict__, "overrides": {**sweep.overrides, "epochs": 2}}))
    statuses = sweep_status(SWEEPS["tiny"], runs, seeds=(0,))
    assert [s.describe() for s in statuses] == ["cut short at epoch 1/2"] * 2
    assert run_sweep("tiny", runs, models=("p4cnn",), seeds=(0,), log=lambda *a, **k: None) == 0
    card = json.loads(cards[0].read_text())
    assert card["training"]["epochs_completed"] == 2
    assert card["training"]["invocations"][-1].endswith("--resume")


def test_a_failing_run_stops_the_sweep_and_names_its_log(tiny_sweep, monkeypatch):
    sweep, runs = tiny_sweep
    corrupt = runs.parent / "corrupt"
    corrupt.mkdir()
    for name in AMAT_FILES:
        (corrupt / name).write_text("not a matrix\n")
    broken = Sweep(**{**sweep.__dict__, "overrides": {**sweep.overrides, "data_dir": corrupt}})
    monkeypatch.setitem(SWEEPS, "tiny", broken)
    lines = []
    assert run_sweep("tiny", runs, log=lambda *a, **k: lines.append(a[0])) == 4
    assert "z2cnn seed 0 failed (exit 1)" in lines[-1] and "train.out" in lines[-1]
    assert AMAT_FILES[0] in (runs / "rot_mnist-z2cnn-seed0" / "train.out").read_text()


def test_parallel_runs_go_at_once_and_a_failure_starts_no_more(tiny_sweep, monkeypatch):
    sweep, runs = tiny_sweep
    started, real_popen = [], sweep_module.subprocess.Popen

    def counting_popen(*args, **kwargs):
        started.append(real_popen(*args, **kwargs))
        started[-1].in_flight = sum(p.poll() is None for p in started)  # runs going when this one started
        return started[-1]

    monkeypatch.setattr(sweep_module.subprocess, "Popen", counting_popen)
    assert run_sweep("tiny", runs, parallel=2, log=lambda *a, **k: None) == 0
    assert [p.in_flight for p in started[:2]] == [1, 2] and max(p.in_flight for p in started) == 2
    assert sorted(c.name for c in (runs.parent / "results").glob("*.json")) == [
        "p4cnn-seed0.json", "p4cnn-seed1.json", "z2cnn-seed0.json", "z2cnn-seed1.json"]

    # Broken data fails the two runs started together; the other two are never started.
    corrupt = runs.parent / "corrupt"
    corrupt.mkdir()
    for name in AMAT_FILES:
        (corrupt / name).write_text("not a matrix\n")
    broken = {**sweep.__dict__, "overrides": {**sweep.overrides, "data_dir": corrupt}, "results": str(runs / "r2")}
    monkeypatch.setitem(SWEEPS, "tiny", Sweep(**broken))
    started.clear()
    lines = []
    assert run_sweep("tiny", runs.parent / "runs2", parallel=2, log=lambda *a, **k: lines.append(a[0])) == 4
    assert len(started) == 2 and sum("failed (exit 1)" in line for line in lines) == 2


def test_a_time_limit_starts_no_run_after_it_and_leaves_cut_short_runs_to_resume(tiny_sweep, monkeypatch):
    sweep, runs = tiny_sweep
    monkeypatch.setitem(SWEEPS, "tiny", Sweep(**{**sweep.__dict__, "overrides": {**sweep.overrides, "epochs": 2}}))
    status = sweep_module.RunStatus("p4cnn", 0, runs / "run", 0, 2, False)
    command = sweep_module.train_command(SWEEPS["tiny"], status, threads=1, time_limit=299.6)
    assert command[command.index("--time-limit") + 1] == "300"
    command = sweep_module.train_command(SWEEPS["tiny"], status, threads=1, time_limit=0.3)
    assert command[command.index("--time-limit") + 1] == "1"  # not "0", which would mean no limit
    # The first run gets a limit too short for its second epoch; then the clock passes the sweep's limit.
    clock, real_command, real_start = [0.0], sweep_module.train_command, sweep_module._start

    def short_command(*args):
        command = real_command(*args)
        return command[:command.index("--time-limit") + 1] + ["0.001"] + command[command.index("--time-limit") + 2:]

    def start_then_pass_the_limit(*args):
        process = real_start(*args)
        clock[0] = 1e9
        return process

    monkeypatch.setattr(sweep_module, "train_command", short_command)
    monkeypatch.setattr(sweep_module, "_start", start_then_pass_the_limit)
    monkeypatch.setattr(sweep_module.time, "time", lambda: clock[0])
    lines = []
    assert run_sweep("tiny", runs, time_limit=100, log=lambda *a, **k: lines.append(a[0])) == 4
    assert sum(line.startswith("[") for line in lines) == 1  # one run started, three not after the limit
    assert lines[-1] == "z2cnn seed 0: cut short at epoch 1/2 by the time limit; the sweep resumes it"
    monkeypatch.undo()
    monkeypatch.setitem(SWEEPS, "tiny", Sweep(**{**sweep.__dict__, "overrides": {**sweep.overrides, "epochs": 2}}))
    assert run_sweep("tiny", runs, models=("z2cnn",), seeds=(0,), log=lambda *a, **k: None) == 0
    card = json.loads(sweep_module.result_card(SWEEPS["tiny"], "z2cnn", 0).read_text())
    assert card["training"]["epochs_completed"] == 2 and "--time-limit 0.001" in card["training"]["invocations"][0]


def test_parallel_below_one_is_refused(capsys):
    with pytest.raises(SystemExit):
        cli_main(["sweep", "table1", "--parallel", "0", "--status"])
    assert "must be at least 1, got 0" in capsys.readouterr().err
    with pytest.raises(ValueError, match="at least 1"):
        run_sweep("table1", "../runs", parallel=0)


def test_unknown_models_are_refused(capsys):
    assert cli_main(["sweep", "table1", "--models", "resnet9", "--status"]) == 2
    assert "resnet9 not in sweep table1" in capsys.readouterr().err


def test_a_committed_card_of_the_recipe_counts_as_done_without_its_run_folder(tiny_sweep, monkeypatch, capsys):
    # A later session on another machine has the cards an earlier one committed, but none of its run folders.
    sweep, runs = tiny_sweep
    assert run_sweep("tiny", runs, models=("z2cnn",), seeds=(0,), log=lambda *a, **k: None) == 0
    fresh = runs.parent / "fresh_runs"
    statuses = sweep_status(sweep, fresh, models=("z2cnn",))
    assert [(s.seed, s.finished, s.card_only) for s in statuses] == [(0, True, True), (1, False, False)]
    assert cli_main(["sweep", "tiny", "--runs-dir", str(fresh), "--models", "z2cnn", "--status"]) == 0
    assert "seed 0: done (its card is in the results folder" in capsys.readouterr().out
    monkeypatch.setattr(sweep_module.subprocess, "Popen", lambda *a, **k: pytest.fail("started a done run"))
    assert run_sweep("tiny", fresh, models=("z2cnn",), seeds=(0,), log=lambda *a, **k: None) == 0
    assert not fresh.exists()

    # A card of another recipe (here one epoch where the sweep now asks for two), or a provisional one, is not
    # this sweep's run: it runs again.
    longer = Sweep(**{**sweep.__dict__, "overrides": {**sweep.overrides, "epochs": 2}})
    assert not sweep_status(longer, fresh, models=("z2cnn",), seeds=(0,))[0].finished
    card_path = sweep_module.result_card(sweep, "z2cnn", 0)
    card = json.loads(card_path.read_text())
    card["training"]["provisional"] = True
    card_path.write_text(json.dumps(card))
    assert not sweep_status(sweep, fresh, models=("z2cnn",), seeds=(0,))[0].finished


def test_runs_fetch_their_data_where_the_reader_can(tmp_path):
    status = sweep_module.RunStatus("p4cnn", 0, tmp_path / "run", 0, 100, False)
    assert "--fetch" in sweep_module.train_command(SWEEPS["table1"], status, threads=1)
    cifar = Sweep(preset="cifar10_allcnnc", models=("allcnnc",), seeds=(0,), results="r")
    cifar_status = sweep_module.RunStatus("allcnnc", 0, tmp_path / "run", 0, 350, False)
    assert "--fetch" not in sweep_module.train_command(cifar, cifar_status, threads=1)


def test_table3_trains_the_five_pcam_densenets_with_one_recipe():
    """Issue 41: only the architecture differs; the budget is at least 40 quarter passes of the training split."""
    sweep = SWEEPS["table3"]
    configs = {model: sweep.config(model) for model in sweep.models}
    assert set(configs) == {"densenet", "p4_densenet", "fa_p4_densenet", "p4m_densenet", "fa_p4m_densenet"}
    recipes = {json.dumps({k: str(v) for k, v in vars(cfg).items() if k != "model"}, sort_keys=True)
               for cfg in configs.values()}
    assert len(recipes) == 1, "the table3 recipes differ in more than the model"
    cfg = configs["densenet"]
    assert cfg.epochs * cfg.epoch_size >= 40 * 7456 and cfg.init_from in (None, "")
    assert (cfg.augment, cfg.precision, cfg.cosine, cfg.select_on) == ("group_stain_strong", "bf16", True, "nll")


def test_table3_seeds_are_table3_with_other_seeds_in_folders_of_their_own(tmp_path):
    table3, seeds = SWEEPS["table3"], SWEEPS["table3_seeds"]
    assert seeds.models == table3.models and seeds.seeds == (1, 2) and seeds.results != table3.results
    assert all(seeds.config(model) == table3.config(model) for model in table3.models)
    folders = {sweep_module.run_folder(tmp_path, sweep, model, seed) for sweep in (table3, seeds)
               for model, seed in sweep.order()}
    assert len(folders) == 15  # no run of one resumes a run of the other

