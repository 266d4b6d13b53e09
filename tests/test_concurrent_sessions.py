"""Many users at once, small: three Chromium sessions upload different images to one ``streamlit run`` at a time.

The machinery of :mod:`benchmarks.concurrent_sessions` (which measures 20
sessions on the shipped checkpoints) against a temporary folder holding one
small dev checkpoint: a warm-up session, then three at once, each uploading its
own image. Every session must be served with its own file name, caption,
picture and the prediction computed offline; the server must load the model
once; its peak memory must be recorded. No timing is asserted.

Without ``/usr/bin/chromium`` or the ``playwright`` package the browser test
skips; with ``REQUIRE_REFERENCE=1`` (CI) it fails, as in ``test_app_browser.py``.
The checks themselves are tested without a browser: a page showing another
session's upload fails them.
"""

from __future__ import annotations

import dataclasses

import pytest
from test_app_browser import require
from test_app_ui import write_dev_checkpoints

from benchmarks import concurrent_sessions as cs

ARCH = "p4cnn"
SESSIONS = 3
TIMEOUT_S = 300  # the bound of the whole run; here it takes well under a minute when the machine is not busy


@pytest.fixture(scope="module")
def dev_checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("checkpoints")
    (path,) = write_dev_checkpoints(folder, [ARCH])
    return path


def test_uploads_differ_and_their_captions_tell_them_apart(dev_checkpoint, tmp_path):
    uploads = cs.make_uploads(tmp_path, cs.WIDTHS, dev_checkpoint)
    assert len({u.name for u in uploads}) == len({u.caption for u in uploads}) == cs.WIDTHS
    assert all(u.rows == 96 and u.cols < 96 for u in uploads)  # narrower than the model's crop: always resized
    assert all(u.rgb.shape == (28, 28, 3) and 0 < u.probability <= 1 for u in uploads)


def test_a_page_showing_another_sessions_upload_fails_the_checks(dev_checkpoint, tmp_path):
    mine, other, third = cs.make_uploads(tmp_path, 3, dev_checkpoint)
    uploads = [mine, other, third]

    def failures(chips, body, label, p, picture):
        result = cs.SessionResult(mine.index, mine.name)
        cs.check_page(result, mine, uploads, chips, body, label, f"p = {p}", picture)
        return result.failures

    right_body = f"Scaled the centred square {mine.caption}."
    assert failures([mine.name], right_body, mine.label, f"{mine.probability:.3f}", mine.rgb) == []
    wrong = [
        failures([other.name], right_body, mine.label, f"{mine.probability:.3f}", mine.rgb),
        failures([mine.name], right_body + " " + other.name, mine.label, f"{mine.probability:.3f}", mine.rgb),
        failures([mine.name], f"Scaled the centred square {other.caption}.", mine.label,
                 f"{mine.probability:.3f}", mine.rgb),
        failures([mine.name], right_body, mine.label, f"{min(mine.probability + 0.002, 0.998):.3f}", mine.rgb),
        failures([mine.name], right_body, mine.label, f"{mine.probability:.3f}", other.rgb),
    ]
    assert all(wrong), wrong
    # A probability on a rounding boundary may print either way; one step further is wrong.
    edge = dataclasses.replace(mine, probability=0.1235)
    for shown, ok in [("0.123", True), ("0.124", True), ("0.122", False)]:
        result = cs.SessionResult(edge.index, edge.name)
        cs.check_page(result, edge, [edge], [edge.name], right_body, edge.label, f"p = {shown}", edge.rgb)
        assert (result.failures == []) == ok, (shown, result.failures)


def test_three_sessions_at_once_each_get_their_own_analysis(dev_checkpoint, tmp_path):
    require(cs.CHROMIUM.exists(), f"{cs.CHROMIUM} not found (apt-get install chromium)")
    require(cs.async_playwright is not None, "the playwright package is missing (pip install -r requirements-dev.txt)")
    report = cs.measure(dev_checkpoint.parent, SESSIONS, tmp_path, timeout=TIMEOUT_S)
    print(cs.markdown(report))
    assert report["failures"] == {}
    assert report["served"] == SESSIONS and report["warmup_served"]
    details = report["sessions_detail"]
    assert len({d["file"] for d in details}) == SESSIONS + 1
    assert all(d["ok"] and d["shown_p"] is not None and d["image_distance"] < d["nearest_other_distance"]
               for d in details)
    # The opening model, and any other the page shows beside it, each loaded by one session for all of them.
    assert report["model_loads"].get(dev_checkpoint.name) == 1 and set(report["model_loads"].values()) == {1}
    assert report["peak_rss_mib"] > 0 and report["peak_rss_after_one_mib"] > 0 and report["sampled_peak_rss_mib"] > 0
