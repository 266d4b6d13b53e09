"""The browser latency benchmark, small: three actions once each on a temporary folder holding one dev checkpoint.

:mod:`benchmarks.browser_latency` (which measures every action on the shipped
checkpoints) runs in-process against ``streamlit run`` and Debian's Chromium:
the warm first page, a quarter turn and a tab switch, one repeat each. Every
requested action must be reported, measured, with times positive and finite, the
first page must have come over the websocket, and the JSON must carry the keys
the module documents. No timing is asserted.

Without ``/usr/bin/chromium`` or the ``playwright`` package the browser test
skips; with ``REQUIRE_REFERENCE=1`` (CI) it fails, as in ``test_app_browser.py``.
The table and the command line are tested without a browser.
"""

from __future__ import annotations

import json
import math

import pytest
from test_app_browser import require
from test_app_ui import write_dev_checkpoints

from benchmarks import browser_latency as bl

ARCH = "p4cnn"
ACTIONS = ("first-warm", "quarter-turn", "tab-switch")
REPORT_KEYS = {"cpu", "cpus", "instruction_set", "streamlit", "chromium", "checkpoints", "warm_up_s", "viewport",
               "quiet_ms", "timeout_s", "repeats", "sessions", "results"}


def test_three_actions_are_measured_in_chromium(tmp_path, capsys):
    require(bl.CHROMIUM.exists(), f"{bl.CHROMIUM} not found (apt-get install chromium)")
    require(bl.sync_playwright is not None, "the playwright package is missing (pip install -r requirements-dev.txt)")
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    write_dev_checkpoints(folder, [ARCH])
    out = tmp_path / "browser_latency.json"
    status = bl.main(["--checkpoints", str(folder), "--page", "he", "--actions", ",".join(ACTIONS), "--repeats", "1",
                      "--json", str(out)])
    table = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert status == 0, table
    assert set(report) == REPORT_KEYS and report["repeats"] == 1
    assert report["warm_up_s"] > 0 and "warm-up before the server (python -m app.warm, as make run)" in table
    results = {r["action"]: r for r in report["results"]}
    assert list(results) == list(ACTIONS), table  # the cold first page is measured, not reported: not asked for
    for key, r in results.items():
        assert set(r) == set(bl.RESULT_KEYS)
        assert r["available"] and not r["errors"], (key, r)
        assert len(r["settled_s"]) == len(r["received_bytes"]) == len(r["sent_bytes"]) == 1, r
        assert all(0 < t < math.inf for t in r["settled_s"]), r
        assert r["mutations"][0] > 0, r  # the page changed
        assert r["min_s"] <= r["median_s"] <= r["max_s"]
        assert r["label"] in table
    assert results["first-warm"]["received_bytes"][0] > 0  # the page's elements come over the websocket
    assert results["first-warm"]["received_kb_median"] > 0
    assert report["chromium"] and report["streamlit"] in table and report["instruction_set"] in table


def test_the_table_says_what_is_not_available():
    actions = {a.key: a for a in bl.ACTIONS}
    missing = bl.ActionResult("rot_mnist", actions["angle-step"], available=False, control="no slider").as_dict()
    measured = bl.ActionResult("he", actions["quarter-turn"], control="radio",
                               samples=[bl.Sample(0.5, 2048, 100, 3), bl.Sample(0.25, 1024, 100, 3),
                                        bl.Sample(1.0, 4096, 100, 3)]).as_dict()
    assert set(missing) == set(measured) == set(bl.RESULT_KEYS)
    assert (measured["median_s"], measured["min_s"], measured["max_s"]) == (0.5, 0.25, 1.0)
    assert measured["received_kb_median"] == 2.0
    panned = bl.ActionResult("slide", actions["slide-pan"], control="drag",
                             samples=[bl.Sample(0.1, 0, 0, 9, [10.0, 30.0]), bl.Sample(0.2, 0, 0, 9, [20.0])]).as_dict()
    assert set(panned) == set(bl.RESULT_KEYS)
    assert (panned["tiles"], panned["tile_ms_median"]) == ([2, 1], 20.0)
    report = dict(cpu="CPU", cpus=2, instruction_set="instruction set: X", streamlit="1", chromium="2",
                  checkpoints="c", quiet_ms=1000.0, repeats=3, results=[measured, missing, panned])
    table = bl.markdown(report)
    assert "| quarter turn | 0.50 | 0.25 | 1.00 | 2.0 | 0.1 |" in table
    assert "| Slide: pan, settled | 0.15 | 0.10 | 0.20 | 0.0; tiles 2, 20 ms median | 0.0 |" in table
    assert "| rot-MNIST: arbitrary-angle step | not available (no slider) |" in table


def test_unknown_actions_are_refused():
    with pytest.raises(SystemExit):
        bl.main(["--actions", "first-warm,spin"])
