"""The training loop end to end on tiny files in the real formats: resume after SIGKILL, torchrun, CLI errors."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from test_data_rot_mnist import write_amat, write_idx

from experiments.results_tables import results_table
from tests.conftest import REPO
from training.cli import main as cli_main
from training.evaluation import evaluate_checkpoint
from training.loop import record_invocation
from training.provenance import from_scratch, hardware, on_cpu

# Tiny, fast runs: p4cnn on 60 amat digits, batch 8.
SMALL = ["--model", "p4cnn", "--batch-size", "8", "--eval-batch-size", "16", "--equivariance-images", "4"]


@pytest.fixture
def amat_dir(tmp_path):
    folder = tmp_path / "rot_mnist"
    folder.mkdir()
    write_amat(folder, n_train=60, n_test=20)
    return folder


def train_args(data_dir, out, *extra):
    return ["train", "rot_mnist", "--data-dir", str(data_dir), "--out", str(out), *SMALL, *extra]


def run_cli(args, **kwargs):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "training", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def test_the_commands_that_moved_to_experiments_still_run_under_their_former_name():
    """``python -m training report ...``, as the shipped cards name it, prints what ``python -m experiments report
    ...`` prints, and a bad argument is refused by it in its words and exit status; training imports nothing of
    experiments (tests/test_imports.py)."""
    from experiments.cli import COMMANDS
    from training.cli import MOVED

    assert MOVED == COMMANDS
    former = run_cli(["report", "checkpoints"])
    out, err = former.communicate(timeout=120)
    assert former.returncode == 0, err
    assert out == results_table("checkpoints") + "\n" and "fa_p4m_densenet_pcam" in out
    refused = run_cli(["intervals"])
    _, err = refused.communicate(timeout=120)
    assert refused.returncode == 2
    assert "python -m experiments intervals: error: the following arguments are required: CARD" in err


def final_weights(run_dir):
    return load_file(str(Path(run_dir) / "best.safetensors"))


def history(run_dir):
    rows = json.loads((Path(run_dir) / "log.json").read_text())
    return [{k: v for k, v in row.items() if k != "seconds"} for row in rows]


def test_a_run_writes_a_complete_card_and_evaluate_reproduces_it(amat_dir, tmp_path):
    out = tmp_path / "run"
    threads = torch.get_num_threads()
    assert cli_main(train_args(amat_dir, out, "--epochs", "2", "--threads", "1")) == 0
    assert torch.get_num_threads() == threads  # --threads was the run's; the caller keeps its own
    card = json.loads((out / "best.json").read_text())
    assert card["arch"] == "p4cnn" and card["group"] == "p4"
    assert card["dataset"]["name"] == "rot_mnist"
    assert card["dataset"]["splits"] == {"train": 50, "valid": 10, "test": 20}
    assert card["input"] == {"size": 28, "channels": 1, "mean": [0.1307], "std": [0.3081], "transposed": False}
    training = card["training"]
    assert training["epochs_completed"] == 2 and training["recipe_epochs"] == 100
    assert training["command"].startswith("python -m training train rot_mnist")
    assert len(training["commit"]) >= 40 or training["commit"] == "unknown"
    assert training["hardware"] and training["provisional"] is False
    assert len(training["code_sha256"]) == 64 and training["commit_check"].startswith(("verified", "unverified"))
    code = {key: training[key] for key in ("commit", "code_sha256", "commit_check")}
    assert training["invocation_hardware"] == [{"hardware": training["hardware"], "from_epoch": 0, **code}]
    assert card["equivariance_error"]["max_relative_logit_error"] < 1e-4
    assert card["equivariance_error"]["max_relative_logit_error_float64"] < 1e-12
    assert {"test_error", "test_nll", "valid_error"} <= set(card["metrics"])
    assert [row["epoch"] for row in json.loads((out / "log.json").read_text())] == [1, 2]
    assert (out / "log.csv").read_text().splitlines()[0].startswith("epoch,lr,train_loss")
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = evaluate_checkpoint(out / "best.safetensors", amat_dir)
    assert again["error"] == card["metrics"]["test_error"]
    assert again["nll"] == pytest.approx(card["metrics"]["test_nll"], rel=1e-6)
    row = results_table(out).splitlines()[-1]
    assert row.startswith("| `best` | rot_mnist (20 test) | 2 (100) | batch_size=8 | ") and "| 2.05 |" in row


def test_resume_after_sigkill_ends_with_the_same_weights(amat_dir, tmp_path):
    epochs = ["--epochs", "5"]
    straight = tmp_path / "straight"
    assert cli_main(train_args(amat_dir, straight, *epochs, "--threads", "1")) == 0

    killed = tmp_path / "killed"
    process = run_cli(train_args(amat_dir, killed, *epochs))
    deadline = time.time() + 120
    while not (killed / "log.json").exists() or len(history(killed)) < 2:
        assert process.poll() is None, process.communicate()
        assert time.time() < deadline, "the run did not reach epoch 2"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert len(history(killed)) < 5, "the run finished before it was killed; the test proved nothing"

    assert cli_main(train_args(amat_dir, killed, *epochs, "--resume", "--threads", "1")) == 0
    assert history(killed) == history(straight)
    card = json.loads((killed / "best.json").read_text())
    assert [c.endswith("--resume --threads 1") for c in card["training"]["invocations"]] == [False, True]
    first, second = card["training"]["invocation_hardware"]
    assert first["from_epoch"] == 0 and 0 < second["from_epoch"] < 5  # the resumed piece starts where the first stopped
    assert "--resume" not in card["training"]["command"]
    expected, actual = final_weights(straight), final_weights(killed)
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name


def test_a_time_limit_stops_at_an_epoch_end_and_the_resumed_run_ends_as_an_uninterrupted_one(amat_dir, tmp_path,
                                                                                                capsys):
    epochs = ["--epochs", "3", "--threads", "1"]
    straight, limited = tmp_path / "straight", tmp_path / "limited"
    assert cli_main(train_args(amat_dir, straight, *epochs)) == 0
    # The first epoch of a call always runs; with a millisecond, no second one is expected to fit.
    assert cli_main(train_args(amat_dir, limited, *epochs, "--time-limit", "0.001")) == 0
    assert "stopped after epoch 1/3" in capsys.readouterr().out
    assert len(history(limited)) == 1
    assert json.loads((limited / "best.json").read_text())["training"]["provisional"] is True
    assert torch.load(limited / "state.pt", weights_only=True).get("finished") is None
    assert cli_main(train_args(amat_dir, limited, *epochs, "--resume", "--time-limit", "600")) == 0
    assert history(limited) == history(straight)
    training = json.loads((limited / "best.json").read_text())["training"]
    straight_command = json.loads((straight / "best.json").read_text())["training"]["command"]
    # The limit cut calls short, not the run: the command that trains it from scratch has none.
    assert training["provisional"] is False and training["command"] == straight_command.replace("straight", "limited")
    assert [c.split("--time-limit ")[1] for c in training["invocations"]] == ["0.001", "600"]
    expected, actual = final_weights(straight), final_weights(limited)
    assert all(torch.equal(expected[name], actual[name]) for name in expected)


def test_the_command_from_scratch_drops_resume_and_the_time_limit():
    assert from_scratch("python -m training train pcam_public --resume --time-limit 500 --threads 3") == (
        "python -m training train pcam_public --threads 3")
    assert from_scratch("python -m training train x --time-limit=5 --out 'a b'") == (
        "python -m training train x --out 'a b'")


def test_a_machine_string_says_whether_it_is_a_cpu():
    assert on_cpu(hardware(torch.device("cpu"))) and on_cpu(hardware(torch.device("cpu"), processes=2))
    assert not on_cpu("NVIDIA H200") and not on_cpu("2 x NVIDIA H200")


def test_a_piece_records_its_machine_beside_its_command_even_after_pieces_that_did_not():
    state = {"invocations": ["train", "train --resume"], "epoch": 37}  # saved by code that kept no machines
    code = {"commit": "0123abc+dirty", "code_sha256": "5a" * 32, "commit_check": "unverified: ..."}
    assert record_invocation(state, "train --resume", "NVIDIA H200", code) == code  # the first with a code record
    assert state["invocations"] == ["train", "train --resume", "train --resume"]
    assert state["invocation_hardware"] == [None, None, {"hardware": "NVIDIA H200", "from_epoch": 37, **code}]
    # A run begun before code hashes: the card keeps its first piece's commit, without this piece's hash.
    old = {"invocations": ["train"], "invocation_hardware": [{"hardware": "CPU", "from_epoch": 0}], "epoch": 3,
           "commit": "fedcba9"}
    assert record_invocation(old, "train --resume", "NVIDIA H200", code) == {"commit": "fedcba9"}


@pytest.mark.parametrize("ema", [[], ["--ema", "0.9"]], ids=["plain", "ema"])
def test_a_finished_run_extended_equals_a_longer_run(amat_dir, tmp_path, ema):
    longer, extended = tmp_path / "longer", tmp_path / "extended"
    assert cli_main(train_args(amat_dir, longer, "--epochs", "2", "--threads", "1", *ema)) == 0
    assert cli_main(train_args(amat_dir, extended, "--epochs", "1", "--threads", "1", *ema)) == 0
    assert cli_main(train_args(amat_dir, extended, "--epochs", "2", "--threads", "1", "--resume", *ema)) == 0
    assert history(extended) == history(longer)
    expected, actual = final_weights(longer), final_weights(extended)
    assert all(torch.equal(expected[name], actual[name]) for name in expected)


def test_refuses_to_overwrite_or_resume_a_different_run(amat_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli_main(train_args(amat_dir, out, "--epochs", "1", "--max-steps", "1")) == 0
    assert cli_main(train_args(amat_dir, out, "--epochs", "1", "--max-steps", "1")) == 1
    assert "already holds a run" in capsys.readouterr().err
    assert cli_main(train_args(amat_dir, out, "--epochs", "1", "--max-steps", "1", "--lr", "0.5", "--resume")) == 1
    assert "'lr': (0.001, 0.5)" in capsys.readouterr().err
    (out / "state.pt").write_bytes(b"not a zip file")
    assert cli_main(train_args(amat_dir, out, "--epochs", "1", "--max-steps", "1", "--resume")) == 1
    assert "state.pt is not a resumable run state" in capsys.readouterr().err


def test_resumes_with_the_data_moved_or_fetched(amat_dir, tmp_path):
    # Where the data comes from is not part of the run: a run started before sweeps passed --fetch, or whose
    # data folder moved, resumes; the card records where the data came from last.
    out, moved = tmp_path / "run", tmp_path / "moved"
    shutil.copytree(amat_dir, moved)
    assert cli_main(train_args(amat_dir, out, "--epochs", "1", "--threads", "1")) == 0
    assert cli_main(train_args(moved, out, "--epochs", "2", "--threads", "1", "--fetch", "--resume")) == 0
    card = json.loads((out / "best.json").read_text())
    assert card["training"]["epochs_completed"] == 2
    assert card["training"]["config"]["data_dir"] == str(moved) and card["training"]["config"]["fetch"] is True


def test_missing_data_names_the_folder(tmp_path, capsys):
    empty = tmp_path / "nothing"
    empty.mkdir()
    assert cli_main(train_args(empty, tmp_path / "run", "--epochs", "1")) == 1
    err = capsys.readouterr().err
    assert "no rot-MNIST data in" in err and str(empty) in err


def test_bad_override_is_a_clear_error(amat_dir, tmp_path, capsys):
    assert cli_main(train_args(amat_dir, tmp_path / "run", "--optimizer", "rmsprop")) == 2
    assert "optimizer must be 'adam' or 'sgd'" in capsys.readouterr().err


def test_presets_lists_every_recipe(capsys):
    assert cli_main(["presets"]) == 0
    text = capsys.readouterr().out
    for name in ("rot_mnist", "cifar10_allcnnc", "cifar10_resnet44", "pcam", "pcam_public", "pcam_table3"):
        assert f"{name}:" in text


def test_validation_of_an_ema_sees_its_latest_weights_on_cuda_too(amat_dir, tmp_path, monkeypatch):
    """CUDA's ``_foreach_lerp_`` (PyTorch 2.11, measured on an H200) updates the average without bumping the
    version counter that keys the group convolutions' kept filter banks; mimicked here on the CPU, validation
    must still see each epoch's averaged weights, not the first epoch's (the bug a GPU sweep found)."""
    def lerp_behind_the_version_counter(targets, sources, weight):
        for target, source in zip(targets, sources, strict=True):
            target.data.lerp_(source, weight)

    monkeypatch.setattr(torch, "_foreach_lerp_", lerp_behind_the_version_counter)
    out = tmp_path / "averaged"
    args = ["--epochs", "2", "--threads", "1", "--lr", "0.1", "--ema", "0.5", "--select-on", "last"]
    assert cli_main(train_args(amat_dir, out, *args)) == 0
    in_run = history(out)[-1]["valid_nll"]  # measured as the run went, on the averaged module it kept
    card = json.loads((out / "best.json").read_text())  # measured afresh on the saved weights of that epoch
    assert card["training"]["best_epoch"] == 2
    assert in_run == pytest.approx(card["metrics"]["valid_nll"], rel=1e-6, abs=1e-7)


def test_two_processes_under_torchrun_agree(amat_dir, tmp_path):
    out = tmp_path / "ddp"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    command = [*torchrun, "-m", "training", *train_args(amat_dir, out, "--epochs", "2", "--device", "cpu")]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    card = json.loads((out / "best.json").read_text())
    assert card["training"]["processes"] == 2
    # Every rank ends with bit-identical parameters (DDP averages the gradients; the check all-gathers them).
    assert card["training"]["max_parameter_difference_between_ranks"] == 0.0
    # Rank 0 alone wrote the run folder, once per epoch.
    assert [row["epoch"] for row in json.loads((out / "log.json").read_text())] == [1, 2]
    # Evaluation was split across the ranks and gathered back: it equals a single-process evaluation.
    again = evaluate_checkpoint(out / "best.safetensors", amat_dir)
    assert again["error"] == card["metrics"]["test_error"]
    assert again["nll"] == pytest.approx(card["metrics"]["test_nll"], rel=1e-5)


def test_weighted_epochs_follow_the_sample_weights_and_uniform_epochs_chain_permutations():
    import dataclasses

    import numpy as np

    from training.data import ArraySplit
    from training.loop import epoch_order
    from training.presets import PRESETS

    split = ArraySplit(np.zeros((10, 1, 2, 2), dtype=np.uint8), np.arange(10) % 2)
    uniform = dataclasses.replace(PRESETS["rot_mnist"], epoch_size=25)
    order = epoch_order(split, uniform, np.random.default_rng(0))
    assert len(order) == 25 and sorted(order[:10]) == list(range(10)) and sorted(order[10:20]) == list(range(10))
    weighted = dataclasses.replace(uniform, sampling="weighted", epoch_size=20000)
    with pytest.raises(ValueError, match=r"sampling='weighted' needs a training split with sample_weights"):
        epoch_order(split, weighted, np.random.default_rng(0))
    split.sample_weights = np.r_[np.full(5, 0.18), np.full(5, 0.02)]
    counts = np.bincount(epoch_order(split, weighted, np.random.default_rng(0)), minlength=10) / 20000
    assert np.allclose(counts, split.sample_weights, atol=0.01)


def test_selection_score_is_lower_for_the_better_model():
    from training.loop import selection_score

    better, worse = {"error": 0.1, "nll": 0.3, "auc": 0.95}, {"error": 0.2, "nll": 0.5, "auc": 0.90}
    for metric in ("error", "nll", "auc"):
        assert selection_score(better, metric) < selection_score(worse, metric), metric
    assert selection_score(worse, "last", epoch=5) < selection_score(better, "last", epoch=4)


def test_cosine_schedule_and_a_final_model_on_training_and_validation_digits(amat_dir, tmp_path, capsys):
    import math

    out = tmp_path / "final"
    assert cli_main(train_args(amat_dir, out, "--epochs", "3", "--threads", "1", "--cosine", "--train-on-valid",
                               "--select-on", "last")) == 0
    rows = json.loads((out / "log.json").read_text())
    # Half a cosine from 1e-3 to 0 over the 3 epochs: the lr each epoch started with.
    assert [row["lr"] for row in rows] == pytest.approx([1e-3 * (1 + math.cos(math.pi * e / 3)) / 2 for e in range(3)])
    card = json.loads((out / "best.json").read_text())
    training = card["training"]
    assert training["best_epoch"] == training["epochs_completed"] == 3  # the last epoch, whatever validation says
    assert training["config"]["train_on_valid"] and training["config"]["cosine"]
    assert any("not held out" in note for note in card["notes"])
    # Every training and validation digit once an epoch (amat fixture: 48 + 12 digits, batch 8).
    assert training["steps"] == 3 * math.ceil(60 / 8)
    # A cosine run's length is part of its schedule: it cannot be extended.
    assert cli_main(train_args(amat_dir, out, "--epochs", "4", "--threads", "1", "--cosine", "--train-on-valid",
                               "--select-on", "last", "--resume")) == 1
    assert "cosine schedule over 3 epochs" in capsys.readouterr().err
    # Training on the validation digits and selecting on them would be a leak: refused.
    assert cli_main(train_args(amat_dir, tmp_path / "leak", "--train-on-valid")) == 2
    assert "use select_on='last'" in capsys.readouterr().err
    assert cli_main(train_args(amat_dir, tmp_path / "both", "--cosine", "--milestones", "2")) == 2
    assert "set only one schedule" in capsys.readouterr().err


def test_concat_split_reads_both_splits_in_the_order_asked():
    from training.data import ArraySplit, ConcatSplit

    first = ArraySplit(np.arange(3, dtype=np.float32).reshape(3, 1, 1, 1), np.arange(3))
    second = ArraySplit(np.arange(3, 5, dtype=np.float32).reshape(2, 1, 1, 1), np.arange(3, 5))
    both = ConcatSplit(first, second)
    images, labels = both.get_batch(np.array([4, 0, 3, 1]))
    assert len(both) == 5 and labels.tolist() == [4, 0, 3, 1] and images.ravel().tolist() == [4, 0, 3, 1]
    images, labels = both.get_batch(np.array([], dtype=np.int64))  # an empty batch keeps its shapes
    assert images.shape == (0, 1, 1, 1) and labels.shape == (0,)


def test_init_from_starts_at_the_checkpoint_and_refuses_another_architecture(amat_dir, tmp_path, capsys):
    first = tmp_path / "first"
    assert cli_main(train_args(amat_dir, first, "--epochs", "1", "--max-steps", "1")) == 0
    start = final_weights(first)
    second = tmp_path / "second"
    args = train_args(amat_dir, second, "--epochs", "1", "--max-steps", "1", "--lr", "1e-12",
                      "--init-from", str(first / "best.safetensors"))
    assert cli_main(args) == 0
    after = final_weights(second)
    moved = max((after[k].double() - start[k].double()).abs().max().item() for k in start if "running" not in k
                and "num_batches" not in k)
    assert moved < 1e-6, "a step with a tiny lr leaves the weights where the checkpoint put them"
    assert cli_main([*train_args(amat_dir, tmp_path / "third", "--epochs", "1", "--init-from",
                                 str(first / "best.safetensors")), "--model", "z2cnn"]) == 1
    assert "is a p4cnn checkpoint: neither z2cnn nor its plain counterpart" in capsys.readouterr().err
    # An attentive model starts from its plain counterpart: the same weights, convolutions scaled by 4/3 for the
    # constant 3/4 that attention whose last weights are zero applies (models.warm_start).
    attentive = tmp_path / "attentive"
    assert cli_main([*args[:-2], "--out", str(attentive), "--init-from", str(first / "best.safetensors"),
                     "--model", "fa_p4cnn"]) == 0
    warm = final_weights(attentive)
    assert torch.allclose(warm["c1.weight"].double(), start["c1.weight"].double() * 4 / 3, rtol=1e-5)
    assert warm["c1.spatial_attention.weight"].abs().max() < 1e-6


def test_ema_saves_the_moving_average_not_the_last_weights(amat_dir, tmp_path):
    import dataclasses

    from training.presets import PRESETS

    runs = {name: tmp_path / name for name in ("one", "two", "averaged")}
    base = ["--epochs", "1", "--threads", "1", "--lr", "0.1"]
    assert cli_main(train_args(amat_dir, runs["one"], *base, "--max-steps", "1")) == 0
    assert cli_main(train_args(amat_dir, runs["two"], *base, "--max-steps", "2")) == 0
    assert cli_main(train_args(amat_dir, runs["averaged"], *base, "--max-steps", "2", "--ema", "0.75")) == 0
    # The average starts at the first step's weights, then moves a quarter of the way to each new step's,
    # BatchNorm statistics included.
    first, second, saved = (final_weights(runs[name]) for name in ("one", "two", "averaged"))
    for name, value in first.items():
        if value.is_floating_point():
            assert torch.allclose(saved[name], 0.75 * value + 0.25 * second[name], atol=1e-6), name
    assert any(not torch.equal(saved[name], second[name]) for name in saved)
    with pytest.raises(ValueError, match=r"ema must be in \[0, 1\)"):
        dataclasses.replace(PRESETS["rot_mnist"], ema=1.0)


def test_redraw_trains_on_fresh_rotations_of_the_upright_digits_and_needs_them(amat_dir, tmp_path, monkeypatch,
                                                                               capsys):
    from training import loop
    from training.data.rot_mnist import load_rot_mnist

    idx_dir = tmp_path / "idx"
    write_idx(idx_dir, n_train=60, n_test=20)
    small = load_rot_mnist(idx_dir, split_sizes=(40, 10, 20))  # the real sizes need all 70,000 digits
    monkeypatch.setattr(loop, "load_dataset", lambda *args, **kwargs: small)
    args = ("--max-steps", "3", "--threads", "1", "--augment", "redraw", "--train-on-valid", "--select-on", "last")
    runs = [tmp_path / name for name in ("a", "b")]
    for run in runs:
        assert cli_main(train_args(idx_dir, run, *args)) == 0
    card = json.loads((runs[0] / "best.json").read_text())
    assert card["training"]["config"]["augment"] == "redraw"
    first, second = final_weights(runs[0]), final_weights(runs[1])
    assert all(torch.equal(first[name], second[name]) for name in first)  # the angles come from the seed

    monkeypatch.undo()
    assert cli_main(train_args(amat_dir, tmp_path / "amat", "--max-steps", "3", "--augment", "redraw")) != 0
    assert "no upright images" in capsys.readouterr().err
    assert not (tmp_path / "amat" / "state.pt").exists()  # refused before the first step


@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_training_and_evaluation_keep_freed_memory_for_reuse(command, tmp_path, monkeypatch):
    # Without it every step faults its activations in afresh: a p4m DenseNet step took twice as long
    # (benchmarks.densenet_step). The call comes before anything can fail, so every run gets it.
    calls = []
    monkeypatch.setattr("training.cli.retain_freed_memory", lambda: calls.append(command) or True)
    missing = tmp_path / "missing"
    args = (train_args(missing, tmp_path / "run") if command == "train"
            else ["evaluate", str(missing / "model.safetensors"), "--data-dir", str(missing)])
    assert cli_main(args) == 1
    assert calls == [command]
