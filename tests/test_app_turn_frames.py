"""The turn viewer's payload: what the browser turns is the network's own maps of every transform (quantised),
for equivariant networks from the image's maps alone, for planar ones from the maps of each transform."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_app_compute import calibrated
from test_app_ui import dev_card

from app.analysis.compute import analyse
from app.analysis.transforms import apply_element
from app.pictures.encode import decode_data_url
from app.pictures.map_style import colour_range, display_maps, overlay
from app.pictures.plots import image_rgb
from app.pictures.turn_frames import frame_pixels, quantise, viewer_payload


def payload_of(arch: str, mode: str = "robust"):
    model, card = calibrated(arch), dev_card(arch)
    size = card["input"]["size"]
    rng = np.random.default_rng(0)
    image = rng.random((card["input"]["channels"], size, size)).astype(np.float32)
    analysis = analyse(model, card, image)
    layer = next(iter(analysis.attention.values()), None) or next(iter(analysis.features.values()))
    maps = display_maps(layer, size, mode)  # (T, H, S, S)
    zrange = colour_range(maps, mode)
    shipped = maps[:1] if analysis.equivariant else maps
    payload = viewer_payload(analysis, layer, shipped, [str(h) for h in range(layer.orientations)], zrange=zrange,
                             colormap="viridis", opacity=0.75, signed=False, style="overlay", colour_title="a")
    return analysis, maps, zrange, payload


@pytest.mark.parametrize("arch", ["a_p4cnn", "fa_p4m_densenet"])
def test_an_equivariant_networks_moved_maps_are_its_maps_of_every_transform(arch):
    analysis, maps, (low, high), payload = payload_of(arch)
    assert payload["exact"] and len(payload["maps"]) == 1, "the image's maps alone travel"
    computed = quantise(maps, low, high)  # (T, H, S, S): the network's maps of every g.x
    for t, move in enumerate(payload["moves"]):
        for h, source in enumerate(move["orientations"]):
            moved = apply_element(decode_data_url(payload["maps"][0][source]), move["element"])
            differ = moved.astype(int) - computed[t, h]
            # float32 round-off moves a value across a quantisation step at a few pixels, by one step at most
            assert np.abs(differ).max() <= 1 and np.count_nonzero(differ) <= 0.002 * differ.size, (t, h)


def test_a_planar_network_ships_its_maps_of_every_transform():
    analysis, maps, (low, high), payload = payload_of("z2cnn")
    assert not payload["exact"] and len(payload["maps"]) == len(analysis.elements)
    for t, move in enumerate(payload["moves"]):
        assert move["source"] == t and move["element"] == 0
        q = decode_data_url(payload["maps"][t][0])
        assert np.array_equal(q, quantise(maps[t, 0], low, high))


def test_a_frame_is_the_overlay_of_the_moved_image_and_map():
    analysis, maps, (low, high), payload = payload_of("a_p4cnn")
    t, h = 5 % len(analysis.elements), 2
    move = payload["moves"][t]
    q = apply_element(decode_data_url(payload["maps"][0][move["orientations"][h]]), move["element"])
    expected = overlay(image_rgb(analysis.images[t]), q / 255.0, 0.0, 1.0, "viridis", 0.75)
    assert np.array_equal(frame_pixels(payload, t, h), expected)
    assert frame_pixels(payload, t, h).shape == (28, 28, 3)


def test_the_turn_is_exact_at_quarter_turns_and_measured_between():
    from app.analysis.reductions import MEANS
    from app.analysis.turning import turning_maps

    model, card = calibrated("a_p4cnn"), dev_card("a_p4cnn")
    image = np.random.default_rng(1).random((1, 28, 28)).astype(np.float32)
    analysis = analyse(model, card, image)
    sequence = turning_maps(model, card, image, "attention/c2", MEANS, step=15)
    assert sequence.degrees.tolist() == list(range(0, 360, 15)) and sequence.maps.shape[:2] == (24, 4)
    quarter = sequence.degrees % 90 == 0
    assert sequence.deviations[quarter].max() < 1e-4, "quarter turns are group elements"
    assert sequence.typical_deviations[~quarter].min() > 10 * sequence.deviations[quarter].max()
    # At 90 degrees the turned image is rot 90's, and its maps are the analysis's maps of that element.
    np.testing.assert_array_equal(sequence.images[6], analysis.images[1])
    np.testing.assert_allclose(sequence.maps[6], analysis.attention["c2"].upsampled(28)[1], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="must divide 90"):
        turning_maps(model, card, image, "attention/c2", MEANS, step=7)


def test_the_turn_comes_in_chunks_that_join_into_the_whole():
    """``turning_chunks`` is what the page sends as it is computed: a batch of angles each, 0 degrees first, and
    joined they are the whole turn bit for bit (each chunk's deviations against the 0-degree maps)."""
    from app.analysis.reductions import MEANS
    from app.analysis.turning import BATCH, TurnSequence, chunked, joined, turning_chunks, turning_maps

    model, card = calibrated("a_p4cnn"), dev_card("a_p4cnn")
    image = np.random.default_rng(2).random((1, 28, 28)).astype(np.float32)
    chunks = list(turning_chunks(model, card, image, "attention/c2", MEANS, step=10))
    assert [len(c.degrees) for c in chunks] == [BATCH] * 4 + [36 - 4 * BATCH]
    whole = turning_maps(model, card, image, "attention/c2", MEANS, step=10)
    for name in TurnSequence.__annotations__:
        np.testing.assert_array_equal(getattr(joined(chunks), name), getattr(whole, name), err_msg=name)
        np.testing.assert_array_equal(getattr(joined(list(chunked(whole))), name), getattr(whole, name))
    with pytest.raises(ValueError, match="must divide 90"):
        next(turning_chunks(model, card, image, "attention/c2", MEANS, step=7))


def test_the_page_sends_the_turn_after_the_viewer_a_chunk_at_a_time(monkeypatch, tmp_path):
    """Watch it turn pressed: the viewer says how many frames come, and each chunk follows as its own element of the
    same component, every frame once, in order; a rerun finds the turn cached and sends the same chunks."""
    from test_app_ui import app as first_run
    from test_app_ui import ok, write_dev_checkpoints

    import app.ui.caches as caches

    write_dev_checkpoints(tmp_path, ["a_p4cnn"])
    at = ok(first_run(monkeypatch, tmp_path))
    computed = []
    real = caches.turning_chunks
    monkeypatch.setattr(caches, "turning_chunks",
                        lambda *args: (computed.append(1) or chunk for chunk in real(*args)))
    at.session_state["maps-turning"] = "pending"
    for _ in range(2):  # pressed, then a rerun
        at = ok(at.run())
        elements = [json.loads(c.proto.json) for c in at.get("bidi_component")]
        viewer = next(e for e in elements if e.get("animation"))
        feeds = [e for e in elements if e.get("feed")]
        assert viewer["animation"]["frames"] == 72 and {f["viewer"] for f in feeds} == {viewer["viewer"]}
        assert [f["start"] for f in feeds] == list(range(0, 72, 8)) and all(f["key"] == viewer["animation"]["key"]
                                                                            for f in feeds)
        degrees = [d for f in feeds for d in f["degrees"]]
        assert degrees == [5.0 * i for i in range(72)] and sum(len(f["maps"]) for f in feeds) == 72
    assert len(computed) == 9, "computed once, in nine chunks; the rerun read the cache"
