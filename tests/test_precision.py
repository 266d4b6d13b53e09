"""models.precision: ``auto`` decided by the CPU's own features (monkeypatched flags), a request it cannot honour
told in a sentence, and the choice naming what ran."""

from __future__ import annotations

import pytest

from models import build_model
from models.cpu import bfloat16_kernels
from models.precision import choose_precision, native_bfloat16

SAPPHIRE_RAPIDS = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
ZEN4 = frozenset({"avx2", "avx512f", "avx512_bf16"})
AVX2_ONLY = frozenset({"avx2", "fma"})


@pytest.fixture(autouse=True)
def _no_isa_limit(monkeypatch):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)


def test_auto_picks_bfloat16_only_with_amx(monkeypatch):
    monkeypatch.setattr(bfloat16_kernels, "available", lambda: True)
    model = build_model("fa_p4m_densenet")
    chosen = choose_precision("auto", model, SAPPHIRE_RAPIDS)
    assert chosen.name == "bfloat16" and "AMX-BF16" in chosen.reason
    for flags in (ZEN4, AVX2_ONLY, frozenset()):
        assert choose_precision("auto", model, flags).name == "float32"
    assert "AVX512-BF16" in choose_precision("auto", model, ZEN4).reason


def test_without_the_kernels_float32_runs_and_is_named(monkeypatch):
    """Without the kernels a bfloat16 input would be attended in float32 and go on in float32: never named bfloat16."""
    monkeypatch.setattr(bfloat16_kernels, "available", lambda: False)
    model = build_model("fa_p4m_densenet")
    assert choose_precision("auto", model, SAPPHIRE_RAPIDS).name == "float32"
    chosen = choose_precision("bfloat16", model, SAPPHIRE_RAPIDS)
    assert chosen.name == "float32" and "kernels cannot be built" in chosen.reason


def test_onednn_limited_below_bfloat16_counts_as_no_native_bfloat16(monkeypatch):
    """The Makefile's AVX2 switches (ONEDNN_MAX_CPU_ISA=AVX2) on an AMX machine: auto keeps float32."""
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert native_bfloat16(SAPPHIRE_RAPIDS) == ()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert native_bfloat16(SAPPHIRE_RAPIDS) == ("avx512_bf16",)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX10_1_512_AMX")
    assert native_bfloat16(SAPPHIRE_RAPIDS) == ("amx_bf16", "avx512_bf16")


def test_bfloat16_asked_without_native_bfloat16_runs_and_says_so(monkeypatch):
    monkeypatch.setattr(bfloat16_kernels, "available", lambda: True)
    chosen = choose_precision("bfloat16", build_model("fa_p4m_densenet"), AVX2_ONLY)
    assert chosen.name == "bfloat16" and "emulated" in chosen.reason and "slower" in chosen.reason


def test_a_network_without_a_bfloat16_path_runs_float32_and_says_why():
    full_attention = build_model("a_p4cnn")
    for requested in ("auto", "bfloat16"):
        chosen = choose_precision(requested, full_attention, SAPPHIRE_RAPIDS)
        assert chosen.name == "float32" and "full attention" in chosen.reason or "without a bfloat16" in chosen.reason


def test_float32_is_always_float32_and_unknown_requests_are_refused():
    assert choose_precision("float32", None, SAPPHIRE_RAPIDS).name == "float32"
    with pytest.raises(ValueError, match="precision must be one of auto, float32, bfloat16"):
        choose_precision("float16")
