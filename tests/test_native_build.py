"""The rule that picks compiled kernels or PyTorch's path (models/cpu/native_build.py): by instruction set, so that
the default is never slower than PyTorch's path where the kernels were not measured faster."""

import platform
import shutil
import warnings
from pathlib import Path

import pytest

from models.cpu import native_build
from models.cpu.native_build import FASTER_THAN_PYTORCH, build_library, instruction_set, kernels_wanted

KERNEL_SOURCES = sorted(Path(native_build.__file__).parent.glob("*.cpp"))
needs_compiler = pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler here")


def test_every_kernel_file_has_a_measured_rule():
    assert {source.name for source in KERNEL_SOURCES} == set(FASTER_THAN_PYTORCH)


@needs_compiler
@pytest.mark.skipif(platform.machine() != "x86_64", reason="reads the x86 flags of /proc/cpuinfo")
def test_instruction_set_of_this_machine_and_of_narrower_targets(monkeypatch):
    monkeypatch.delenv("AAGC_NATIVE_MARCH", raising=False)  # the machine's own target, not one set to measure
    flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")).split()
    expected = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "avx" if "avx" in flags else "sse2"
    assert instruction_set() == expected
    assert instruction_set("x86-64-v3") == "avx2"
    assert instruction_set("x86-64-v2") == "sse2"
    assert instruction_set("no-such-cpu") == "none"


@pytest.mark.parametrize("setting,isa,wanted", [
    (None, "avx512", True), (None, "avx2", True), (None, "neon", False), (None, "sse2", False), (None, "avx", False),
    ("0", "avx512", False), ("1", "neon", True), ("auto", "avx2", True),
])
def test_kernels_are_wanted_where_measured_faster_unless_the_environment_says(setting, isa, wanted, monkeypatch):
    if setting is None:
        monkeypatch.delenv("AAGC_NATIVE", raising=False)
    else:
        monkeypatch.setenv("AAGC_NATIVE", setting)
    assert all(kernels_wanted(source, isa) == wanted for source in KERNEL_SOURCES)


@needs_compiler
def test_an_unmeasured_instruction_set_runs_pytorch_without_building_or_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("AAGC_CACHE", str(tmp_path))
    monkeypatch.delenv("AAGC_NATIVE", raising=False)
    monkeypatch.setattr(native_build, "_instruction_set", lambda compiler, march: "neon")
    build_library.cache_clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert all(build_library(source) is None for source in KERNEL_SOURCES)
        assert list(tmp_path.iterdir()) == []
    finally:
        build_library.cache_clear()
