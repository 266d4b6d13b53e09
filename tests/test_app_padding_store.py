"""Padding borders measured once per weights and kept on disk, and ``python -m app.warm`` filling the store."""

from __future__ import annotations

import json

from test_app_compute import calibrated
from test_app_ui import dev_card, write_dev_checkpoints

from app import warm
from app.analysis import padding
from app.analysis.padding import measured_borders, model_digest, stored_borders


def test_borders_are_measured_once_and_read_back(tmp_path, monkeypatch):
    model, card = calibrated("a_p4cnn"), dev_card("a_p4cnn")
    first = stored_borders(model, card, tmp_path)
    assert first == measured_borders(model, card) and any(first.values())
    stored = tmp_path / f"{model_digest(model, card)}.json"
    assert json.loads(stored.read_text()) == first

    def fail(*args):
        raise AssertionError("measured again although stored")

    monkeypatch.setattr(padding, "measured_borders", fail)
    assert stored_borders(model, card, tmp_path) == first


def test_a_damaged_store_is_measured_again_and_replaced(tmp_path):
    model, card = calibrated("p4cnn"), dev_card("p4cnn")
    stored = tmp_path / f"{model_digest(model, card)}.json"
    stored.write_text("{not json")
    assert stored_borders(model, card, tmp_path) == measured_borders(model, card)
    assert json.loads(stored.read_text()) == measured_borders(model, card)


def test_the_digest_follows_the_weights_and_the_input_convention():
    model, card = calibrated("p4cnn"), dev_card("p4cnn")
    digest = model_digest(model, card)
    assert model_digest(model, json.loads(json.dumps(card))) == digest
    assert model_digest(model, {**card, "input": {**card["input"], "mean": [0.5]}}) != digest
    next(model.parameters()).data[0] += 1.0
    assert model_digest(model, card) != digest


def test_warm_stores_every_checkpoints_borders(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    write_dev_checkpoints(folder, ["p4cnn"])
    monkeypatch.setenv("APP_CHECKPOINTS", str(folder))
    monkeypatch.setenv("AAGC_CACHE", str(tmp_path / "cache"))
    assert warm.main() == 0
    assert "p4cnn_dev: padding borders ready" in capsys.readouterr().err
    assert len(list((tmp_path / "cache" / "padding").glob("*.json"))) == 1
