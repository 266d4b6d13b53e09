"""Attention against nuclei (the paper's Fig. 5 claim, per patch): rank correlation, tissue and background."""

import numpy as np
import pytest
from test_app_compute import calibrated, card_for

from app.analysis.compute import analyse
from app.analysis.nuclei import MIN_BACKGROUND, attention_on_nuclei, spearman
from models.stain import _box_mean, hed_to_rgb, region_tissue_mask, tissue_mask


def spearman_slow(a, b):
    """Pearson's correlation of average ranks, each rank counted the slow way."""
    def ranks(x):
        return np.array([(x < v).sum() + ((x == v).sum() + 1) / 2 for v in x])
    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


def test_spearman_matches_its_definition_with_ties():
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 5, 200).astype(float), rng.random(200)
    b[:50] = 0.5
    assert spearman(a, b) == pytest.approx(spearman_slow(a, b), abs=1e-12)
    assert spearman(b, np.exp(3 * b)) == pytest.approx(1.0)
    assert spearman(b, -b) == pytest.approx(-1.0)
    assert np.isnan(spearman(np.ones(10), b[:10]))


def he_patch(size=96, glass_columns=30, seed=0):
    """Left ``glass_columns`` columns glass; the rest eosin stroma with haematoxylin-dark round nuclei."""
    rng = np.random.default_rng(seed)
    hed = np.zeros((size, size, 3))
    hed[:, glass_columns:, 1] = 0.35
    rows, cols = np.mgrid[:size, :size]
    for r, c in rng.integers([8, glass_columns + 8], [size - 8, size - 8], size=(12, 2)):
        hed[..., 0] += 0.9 * (np.hypot(rows - r, cols - c) < 4)
    rgb = np.clip(hed_to_rgb(hed), 0, 255) / 255
    return rgb.transpose(2, 0, 1).astype(np.float32)  # (3, S, S)


@pytest.fixture(scope="module")
def analysed():
    model = calibrated("fa_p4m_densenet")
    return analyse(model, card_for("fa_p4m_densenet"), he_patch(), element=0)


def test_measures_the_first_attention_layer_on_tissue_and_glass(analysed):
    result = attention_on_nuclei(analysed)
    assert result.layer == next(iter(analysed.attention))
    tissue, attention = result.tissue, result.attention
    assert not tissue[:, :24].any() and tissue[:, 36:].all(), "glass left, stroma right, up to the window's reach"
    assert result.tissue_fraction == pytest.approx(tissue.mean())
    assert result.tissue_mean == pytest.approx(attention[tissue].mean(), rel=1e-6)
    assert result.background_mean == pytest.approx(attention[~tissue].mean(), rel=1e-6)
    assert result.spearman == pytest.approx(spearman(attention, result.haematoxylin))
    assert 0 <= attention.min() and attention.max() <= 1, "effective attention alpha-plus"


def test_region_tissue_mask_fills_the_pale_gaps_between_nuclei_but_not_glass():
    pixels = np.full((40, 60, 3), 250.0)  # glass
    pixels[:, 20:] = (230, 200, 225)  # pale cytoplasm, OD below the threshold pixel by pixel
    rows, cols = np.mgrid[:40, :60]
    pixels[(rows % 4 < 2) & (cols % 4 < 2) & (cols >= 20)] = (60, 40, 120)  # a lattice of small dark nuclei in it
    assert not tissue_mask(pixels)[:, 20:].all()
    region = region_tissue_mask(pixels, window=7)
    assert region[:, 24:].all() and not region[:, :15].any()
    values = np.random.default_rng(0).random((9, 13))
    slow = np.array([[values[max(r - 2, 0):r + 3, max(c - 2, 0):c + 3].mean() for c in range(13)] for r in range(9)])
    assert np.allclose(_box_mean(values, 5), slow, atol=1e-12)


def test_every_group_transform_gives_the_same_numbers(analysed):
    first = attention_on_nuclei(analysed)
    for t in range(1, len(analysed.elements)):
        moved = attention_on_nuclei(analysed, transform=t)
        for name in ("spearman", "tissue_mean", "background_mean", "tissue_fraction"):
            assert getattr(moved, name) == pytest.approx(getattr(first, name), abs=1e-5), (t, name)


def test_no_background_and_no_attention():
    model = calibrated("fa_p4m_densenet")
    all_tissue = analyse(model, card_for("fa_p4m_densenet"), he_patch(glass_columns=0))
    result = attention_on_nuclei(all_tissue)
    assert result.background_mean is None and "no background" in result.text
    assert (~result.tissue).mean() < MIN_BACKGROUND
    planar = analyse(calibrated("z2cnn"), card_for("z2cnn"), np.zeros((1, 28, 28), np.float32))
    assert attention_on_nuclei(planar) is None


def test_slow_definition_agrees_on_a_real_map(analysed):
    result = attention_on_nuclei(analysed)
    # 96 x 96 pixels is slow the slow way: a random 400 of them
    index = np.random.default_rng(1).choice(result.attention.size, 400, replace=False)
    a, h = result.attention.ravel()[index], result.haematoxylin.ravel()[index]
    assert spearman(a, h) == pytest.approx(spearman_slow(a, h), abs=1e-12)


def test_test_set_summary_counts_only_patches_with_tissue_and_background():
    from app.analysis.nuclei import NucleiAttention
    from benchmarks.attention_on_nuclei import layer_table, summarise

    empty = np.zeros((2, 2))
    results = [NucleiAttention("c1", rho, tissue, background, 0.5, empty, empty, empty.astype(bool))
               for rho, tissue, background in ((0.2, 0.7, 0.6), (-0.1, 0.7, None), (0.5, 0.7, 0.8), (0.2, None, 0.9))]
    summary = summarise(results[:3], ["a", "b", "c"])
    assert summary["spearman_with_haematoxylin"]["mean"] == pytest.approx(0.2)
    assert summary["spearman_with_haematoxylin"]["std"] == pytest.approx(0.3)
    assert summary["share_positive"] == pytest.approx(2 / 3)
    gap = summary["tissue_minus_background"]
    assert gap["count"] == 2 and gap["mean"] == pytest.approx(0.0)
    assert [p["file"] for p in summary["per_patch"]] == ["a", "b", "c"]
    # The fourth patch is glass only (no tissue): it has no tissue-minus-background gap.
    assert layer_table({"c1": results})["c1"]["tissue_minus_background_mean"] == pytest.approx(0.0)
    assert summarise(results, list("abcd"))["tissue_minus_background"]["count"] == 2


def test_the_test_set_measure_equals_the_apps_on_every_layer():
    # The benchmark runs only the image as given, several patches per pass; the app analyses all eight
    # transforms of one. Same maps and numbers to round-off, in every attentive layer, across batch boundaries.
    from benchmarks.attention_on_nuclei import measure

    model, card = calibrated("fa_p4m_densenet"), card_for("fa_p4m_densenet")
    images = np.stack([he_patch(seed=seed, glass_columns=10 * seed) for seed in range(3)])
    by_layer = measure(model, card, images, batch=2)
    assert len(by_layer) > 1
    for i, image in enumerate(images):
        analysis = analyse(model, card, image)
        assert list(by_layer) == list(analysis.attention)
        for name, results in by_layer.items():
            expected, got = attention_on_nuclei(analysis, layer=name), results[i]
            np.testing.assert_allclose(got.attention, expected.attention, atol=1e-5, err_msg=name)
            if name == "c1":  # deeper maps, stretched from a few pixels, are near-ties whose ranks round-off decides
                assert got.spearman == pytest.approx(expected.spearman, abs=1e-4)
            assert got.tissue_mean == pytest.approx(expected.tissue_mean, abs=1e-5), name
            assert (got.background_mean is None) == (expected.background_mean is None), name
