"""The one rule for committed numbers against their recomputation (:mod:`tests.recorded_numbers`)."""

from __future__ import annotations

import pytest

from tests.recorded_numbers import FLOAT64_STATISTIC, assert_same_numbers, differences


def test_the_avx2_difference_of_issue_58_is_round_off():
    """The NLL bound that failed bit for bit on an AVX2 machine: one ulp apart."""
    recorded = {"nll": {"low": 0.24114938752153897, "high": 0.2908677966854976, "method": "bootstrap, seed 0"}}
    measured = {"nll": {"low": 0.24114938752153897, "high": 0.29086779668549767, "method": "bootstrap, seed 0"}}
    assert recorded != measured and differences(measured, recorded) == []


def test_a_stale_record_is_named_where_it_differs():
    recorded = {"auc": {"low": 0.9312, "high": 0.9561}, "count": 1944}
    stale = {"auc": {"low": 0.9312 + 1e-4, "high": 0.9561}, "count": 1944}  # intervals drawn again: 1e-4 and more
    assert differences(stale, recorded) == ["auc.low: 0.9313 now, 0.9312 recorded"]
    with pytest.raises(AssertionError, match=r"record it again \(beyond round-off, rel 1e-12\):\n  auc\.low: "):
        assert_same_numbers(stale, recorded, "record it again")


def test_near_zero_differences_are_judged_on_the_scale_of_what_made_them():
    assert differences({"difference": 1e-15}, {"difference": -1e-15}) == []
    assert differences({"difference": 1e-9}, {"difference": 0.0}) != []


def test_anything_but_floats_must_be_equal():
    assert differences({"n": 3, "m": "a", "ok": True}, {"n": 3, "m": "a", "ok": True}) == []
    assert differences({"n": 3}, {"n": 4}) == ["n: 3 now, 4 recorded"]
    assert differences({"m": "a"}, {"m": "b"}) == ["m: 'a' now, 'b' recorded"]
    assert differences({"ok": True}, {"ok": 1.0}) != []
    assert differences({"xs": [1.0, 2.0]}, {"xs": [1.0]}) == ["xs: 2 items against 1 recorded"]
    assert differences({"a": 1.0}, {"b": 1.0}) == ["top: keys ['a'] against recorded ['b']"]
    assert differences({"x": float("nan")}, {"x": float("nan")}) == []


def test_an_integral_float_and_its_int_agree():
    """JSON writes 2.0 as 2.0 and reads it back as a float; a count recomputed as an int is the same number."""
    assert differences({"x": 2.0}, {"x": 2}) == [] and FLOAT64_STATISTIC == 1e-12
