"""benchmarks.train_step over several rounds keeps each model's fastest round, path by path."""

from __future__ import annotations

from benchmarks.train_step import add_ratios, fastest_rounds, note


def result(model, seconds, pytorch=None, delta=100.0):
    row = {"model": model, "seconds": seconds, "times": [seconds] * 3, "delta_mib": delta}
    if pytorch is not None:
        row["pytorch_seconds"], row["pytorch_times"] = pytorch, [pytorch] * 3
    return row


def test_each_model_and_path_keeps_its_fastest_round():
    rounds = [
        [result("p4cnn", 0.13, 0.12, delta=120), result("a_p4cnn", 0.47, 1.6)],
        [result("p4cnn", 0.10, 0.14, delta=125), result("a_p4cnn", 0.58, 1.3)],
    ]
    merged = fastest_rounds(rounds)
    add_ratios(merged)
    p4, attentive = merged
    assert (p4["seconds"], p4["delta_mib"], p4["pytorch_seconds"]) == (0.10, 125, 0.12)
    assert (attentive["seconds"], attentive["pytorch_seconds"]) == (0.47, 1.3)
    assert attentive["round_seconds"] == [0.47, 0.58] and attentive["pytorch_round_seconds"] == [1.6, 1.3]
    assert attentive["time_ratio"] == 0.47 / 0.10
    assert note(attentive) == "rounds 0.470/0.580 s"


def test_a_failure_in_any_round_is_the_models_result():
    rounds = [[result("p4cnn", 0.1), result("a_p4cnn", 0.5)],
              [result("p4cnn", 0.1), {"model": "a_p4cnn", "error": "killed by SIGKILL (likely out of memory)"}]]
    merged = fastest_rounds(rounds)
    assert merged[1] == rounds[1][1]
    assert note(merged[1]).startswith("FAILED: killed by SIGKILL")


def test_one_round_reads_as_before():
    (only,) = fastest_rounds([[result("p4cnn", 0.1, 0.11)]])
    assert only["seconds"] == 0.1 and only["pytorch_seconds"] == 0.11 and note(only) == ""
