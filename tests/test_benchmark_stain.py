"""benchmarks.stain: the goal's arithmetic, and each condition's pipeline on a few real PCam test patches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, require_shared

from benchmarks import stain as bench
from benchmarks.stain_conditions import GOAL, Perturbation, condition_images, recovery, resampled_recovery, verdict
from experiments.patch_records import tumour_probability
from models import build_model, load_checkpoint
from models.stain_normalise import compose, concentrations, estimate_stain, normalise
from training.data import ArraySplit
from training.data.pcam_public import decode_all, read_labels

DEFAULT = "fa_p4m_densenet_pcam"


@pytest.fixture(scope="module")
def patches() -> tuple[np.ndarray, np.ndarray]:
    """The first 8 test patches of pcam_public, uint8 (8, 3, 96, 96), by the project's own decoder."""
    root = require_shared(REPO.parent / "shared" / "data" / "pcam_public", "pcam_public is not in ../shared")
    records = [r for r in read_labels(root) if r.split == "test"][:8]
    return decode_all(root, records, threads=1), np.array([r.label for r in records], dtype=np.int64)


@pytest.fixture(scope="module")
def tiny_model():
    """A small untrained fa_p4m_densenet (seeded) with the default card's input normalisation: the pipeline's
    arithmetic does not depend on the weights, and the shipped model takes seconds a patch on a loaded CPU."""
    torch.manual_seed(0)
    shipped = load_checkpoint(REPO / "checkpoints" / f"{DEFAULT}.safetensors")[1]
    card = {"arch": "fa_p4m_densenet", "input": shipped["input"]}
    return build_model("fa_p4m_densenet", channels=2, blocks=1).eval(), card


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # conftest restores the session's count; two threads wait on each other when loaded


def crops(images: np.ndarray) -> np.ndarray:
    """The central 33 x 33 pixels (PCam's label region and a border) of ``(N, 3, 96, 96)`` patches."""
    return np.ascontiguousarray(images[:, :, 31:64, 31:64])


def test_the_first_attentive_layer_of_the_shipped_models():
    default = load_checkpoint(REPO / "checkpoints" / f"{DEFAULT}.safetensors")[0]
    plain = load_checkpoint(REPO / "checkpoints" / "p4m_densenet_pcam.safetensors")[0]
    assert bench.first_spatial_layer(default) == "c1"  # alpha_F on the image: alpha_s (B, 1, 96, 96)
    assert bench.first_spatial_layer(plain) is None


def test_recovery_is_the_share_of_the_lost_auc_given_back():
    assert recovery(0.95, 0.85, 0.93) == pytest.approx(0.8)
    assert verdict(recovery(0.95, 0.85, 0.93)) == "PASS"
    assert recovery(0.95, 0.85, 0.90) == pytest.approx(0.5)
    assert verdict(0.5) == "NOT MET" and verdict(GOAL - 1e-9) == "NOT MET"
    assert recovery(0.95, 0.85, 0.80) == pytest.approx(-0.5)  # normalising made it worse still
    assert recovery(0.95, 0.95, 0.90) is None and recovery(0.90, 0.95, 0.90) is None  # nothing was lost
    assert verdict(None).startswith("PASS (re-staining lost no AUC")


def test_resampled_recovery_pairs_the_three_aucs():
    rng = np.random.default_rng(0)
    labels = np.repeat([0, 1], 40)
    scanned = labels + rng.normal(0, 0.5, 80)
    restained = labels + rng.normal(0, 2.0, 80)
    # Normalised = as scanned: every resample recovers exactly all of what it lost.
    assert resampled_recovery(labels, scanned, restained, scanned.copy()) == (1.0, 1.0)
    # Re-staining that changes nothing loses nothing on some resamples: no interval.
    assert resampled_recovery(labels, scanned, scanned.copy(), restained) is None


def test_scanned_without_normalisation_is_the_evaluators_probabilities(patches, tiny_model):
    images, labels = crops(patches[0][:2]), patches[1][:2]
    model, card = tiny_model
    same, done = condition_images(images, np.arange(2), Perturbation("scanned", "as scanned"), "none", None)
    assert np.array_equal(same, images) and done.all()
    tumour, maps = bench.evaluate(model, card, same, bench.first_spatial_layer(model))
    assert np.array_equal(tumour, tumour_probability(model, card, ArraySplit(images, labels)))
    assert maps.shape == (2, 33, 33) and 0 < maps.min() and maps.max() < 1  # alpha_s, a sigmoid
    with torch.inference_mode():
        _, trace = model.trace(torch.rand(1, 3, 33, 33), record=("c1",))
    assert set(trace.attention) == {"c1"} and set(trace.features) == {"c1"}  # the other layers' outputs not held


def test_restain_and_jitter_change_the_patches_and_repeat(patches):
    images = patches[0][:2]
    target, origin = (estimate_stain(patches[0][i].transpose(1, 2, 0)) for i in (7, 6))
    restained, done = condition_images(images, np.arange(2), Perturbation("restain_x", "x", target, origin),
                                       "none", None)
    assert done.all() and not np.array_equal(restained, images)
    jitter = Perturbation("hed_0.2", "strong", jitter=0.2)
    first, _ = condition_images(images, np.array([5, 6]), jitter, "none", None)
    again, _ = condition_images(images, np.array([5, 6]), jitter, "none", None)
    other, _ = condition_images(images, np.array([7, 8]), jitter, "none", None)
    assert np.array_equal(first, again) and not np.array_equal(first, other)  # seeded by the patch's index
    with pytest.raises(ValueError, match="unknown normalisation 'vahadane'"):
        condition_images(images, np.arange(2), jitter, "vahadane", None)


def test_a_pooled_normalisation_maps_every_patch_from_one_estimate_of_them_all(patches):
    """``macenko_set`` and ``reinhard_set``: the Slide page's way (every tile from the slide's estimate), on the
    condition's patches pooled; each patch's own estimate otherwise."""
    from benchmarks.stain_conditions import NORMALISATIONS, normalisation_label

    images = patches[0][:6]
    reference = estimate_stain(patches[0][7].transpose(1, 2, 0))
    scanned = Perturbation("scanned", "as scanned")
    pooled = estimate_stain(images.transpose(0, 2, 3, 1))
    for method in ("macenko", "reinhard"):
        assert f"{method}_set" in NORMALISATIONS
        one, done = condition_images(images, np.arange(6), scanned, f"{method}_set", reference)
        each, _ = condition_images(images, np.arange(6), scanned, method, reference)
        expected = np.stack([normalise(image.transpose(1, 2, 0), method, reference, pooled) for image in images])
        assert done.all() and np.array_equal(one, expected.transpose(0, 3, 1, 2))
        assert not np.array_equal(one, each)
        assert normalisation_label(f"{method}_set") == f"{method}, one estimate of the set"
        assert normalisation_label(method) == f"{method}, each patch's own estimate"


def test_run_on_eight_patches_gives_each_condition_and_the_goal(patches, tiny_model, tmp_path: Path):
    images, labels = crops(patches[0]), patches[1]
    target = estimate_stain(images[3].transpose(1, 2, 0))
    reference = estimate_stain(images[5].transpose(1, 2, 0))  # a stand-in: the pipeline, not PCam's reference
    only = {"scanned+none", "restain_x+none", "restain_x+macenko"}
    cache = bench.Cache(tmp_path, {"test": 1})
    summary = bench.run({DEFAULT: tiny_model}, images, labels, {"x": target}, reference, cache, only=only)
    result = summary[DEFAULT]
    assert result["layer"] == "c1" and set(result["conditions"]) == only
    scanned = result["conditions"]["scanned+none"]
    assert scanned["mean_abs_dp"] == 0 and scanned["mean_abs_dalpha"] == 0 and scanned["flipped"] == 0
    assert scanned["not_done"] == 0
    restained = result["conditions"]["restain_x+none"]
    assert restained["mean_abs_dp"] > 0 and restained["mean_abs_dalpha"] > 0
    auc = {key: c["auc"]["value"] for key, c in result["conditions"].items()}
    goal = result["recovery"]["restain_x+macenko"]
    assert goal["share"] == recovery(auc["scanned+none"], auc["restain_x+none"], auc["restain_x+macenko"])
    assert goal["verdict"] == verdict(goal["share"])
    lines = bench.table(DEFAULT, result, len(images))
    assert any(f"**{goal['verdict']}**" in line and "re-stained to x, macenko" in line for line in lines)
    # A second run reads every model's outputs back from the cache (only the colours are made again): the same
    # figures, and the model's seconds are the first run's.
    again = bench.run({DEFAULT: tiny_model}, images, labels, {"x": target}, reference, cache, only=only)
    for key, first in result["conditions"].items():
        second = again[DEFAULT]["conditions"][key]
        assert second["seconds"][1] == first["seconds"][1]
        assert {k: v for k, v in second.items() if k != "seconds"} == {k: v for k, v in first.items() if k != "seconds"}
    assert again[DEFAULT]["recovery"] == result["recovery"] and again[DEFAULT]["missing"] == []
    # --report: what a cache holds, measuring nothing; an empty one names every condition as not measured.
    report = bench.run({DEFAULT: tiny_model}, images, labels, {"x": target}, reference, cache, only=only,
                       measure=False)
    assert report[DEFAULT]["conditions"] == again[DEFAULT]["conditions"]
    empty = bench.run({DEFAULT: tiny_model}, images, labels, {"x": target}, reference,
                      bench.Cache(tmp_path / "empty", {"test": 1}), only=only, measure=False)
    assert empty[DEFAULT]["conditions"] == {} and set(empty[DEFAULT]["missing"]) == only


def test_the_true_stain_normalises_a_restained_set_back_from_the_stain_put_on_it(patches):
    """``macenko_true``, the ceiling of the goal: no estimate, the re-staining's own target as the source; only a
    re-stained set has one."""
    from benchmarks.stain_conditions import TRUE, normalisation_label

    images = patches[0][:3]
    reference = estimate_stain(patches[0][7].transpose(1, 2, 0))
    target = estimate_stain(patches[0][6].transpose(1, 2, 0))
    restained = Perturbation("restain_x", "x", target, reference)
    back, done = condition_images(images, np.arange(3), restained, TRUE, reference)
    plain, _ = condition_images(images, np.arange(3), restained, "none", reference)
    expected = normalise(plain.transpose(0, 2, 3, 1), "macenko", reference, target).transpose(0, 3, 1, 2)
    assert done.all() and np.array_equal(back, expected)
    assert normalisation_label(TRUE) == "macenko, the slide's true stain"
    with pytest.raises(ValueError, match="unknown normalisation 'macenko_true' of 'scanned'"):
        condition_images(images, np.arange(3), Perturbation("scanned", "as scanned"), TRUE, reference)


def test_the_patches_two_stains_only_are_a_condition_as_they_are_and_never_normalised(patches):
    """What a two-stain model keeps of a patch, without another lab's colours: re-stained to the set's own stain,
    the residual dropped."""
    from benchmarks.stain_conditions import NORMALISATIONS, applies, perturbations

    origin = estimate_stain(patches[0][7].transpose(1, 2, 0))
    plan = perturbations({"x": estimate_stain(patches[0][6].transpose(1, 2, 0))}, origin)
    two = next(p for p in plan if p.key == "two_stains")
    assert [m for m in NORMALISATIONS if applies(two, m)] == ["none"]
    images = patches[0][:2]
    kept, done = condition_images(images, np.arange(2), two, "none", origin)
    expected = np.stack([compose(concentrations(i.transpose(1, 2, 0), origin.vectors), origin.vectors) for i in images])
    assert done.all() and np.array_equal(kept, expected.transpose(0, 3, 1, 2))
