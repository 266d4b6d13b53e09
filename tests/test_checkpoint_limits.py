"""Checkpoints are bounded before anything is built: a small hostile file is refused with a sentence, in little memory
(issue 66). Peaks are measured in a fresh process (its own VmHWM), where the upload is loaded as the app loads it."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import zipfile

import pytest
import torch
from crafted_checkpoints import card_only_checkpoint, card_with, deflate_bomb, legacy_storage_bomb
from safetensors.torch import load_file

from models import CheckpointError, import_reference_checkpoint, load_checkpoint
from models.arch_detection import signature
from models.checkpoint_limits import (
    CONFIG_LIMITS,
    MAX_INFLATION,
    MAX_PARAMETERS,
    MAX_PTH_BYTES,
    check_pth_archive,
    planned_state,
    read_safetensors_header,
)
from models.registry import list_models, model_info
from tests.conftest import REPO

SHIPPED = REPO / "checkpoints" / "p4cnn_rot_mnist.safetensors"
PEAK_BOUND_MB = 1024  # the bound for a refused checkpoint, the loading process's whole peak

# Loads each file as the app's upload path does, and says what happened; then the process's peak resident memory.
# The peak is the process's own high-water mark (VmHWM), not ru_maxrss: Linux carries a parent's maximum over fork
# and exec, so a child of a pytest process of 2 GB reported 2 GB whatever it did.
_LOAD_AS_UPLOADED = """
import json, sys
from pathlib import Path
from app.analysis.checkpoints import CheckpointError, load_uploaded_checkpoint
said = {}
for name in sys.argv[1:]:
    path = Path(name)
    try:
        load_uploaded_checkpoint(path.read_bytes(), path.name)
        said[path.name] = None
    except CheckpointError as err:
        said[path.name] = str(err)
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"said": said, "peak_mb": int(hwm.split()[1]) / 1024}))
"""


@pytest.fixture(scope="module")
def uploaded(tmp_path_factory) -> dict:
    """The hostile files made here, loaded one after the other in one fresh process as uploads:
    ``{"said": {file name: the CheckpointError's message or None}, "peak_mb": that process's peak RSS}``."""
    folder = tmp_path_factory.mktemp("hostile")
    paths = [card_only_checkpoint(folder / f"wide{channels}.safetensors", card_with(channels=channels))
             for channels in (20000, 1500)]
    paths.append(card_only_checkpoint(folder / "many.safetensors", card_with(channels=800)))
    paths.append(deflate_bomb(folder / "bomb.pth"))
    paths.append(legacy_storage_bomb(folder / "legacy.pth"))
    done = subprocess.run([sys.executable, "-c", _LOAD_AS_UPLOADED, *map(str, paths)], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    return {"sizes": {path.name: path.stat().st_size for path in paths},
            **json.loads(done.stdout.strip().splitlines()[-1])}


@pytest.mark.parametrize("channels", [20000, 1500])
def test_a_small_card_asking_for_a_huge_network_is_refused_in_little_memory(uploaded, channels):
    name = f"wide{channels}.safetensors"
    assert uploaded["sizes"][name] < 8192  # the card and one tiny tensor
    low, high = CONFIG_LIMITS["channels"]
    assert uploaded["said"][name] == (f"model card of {name}: config field 'channels' is {channels}, outside "
                                      f"{low}..{high}, the limit of what this server builds (its largest real model "
                                      "is far smaller)")
    assert uploaded["peak_mb"] < PEAK_BOUND_MB


def test_a_config_within_each_field_but_too_many_parameters_is_refused_from_the_meta_build(tmp_path, uploaded):
    path = card_only_checkpoint(tmp_path / "many.safetensors", card_with(channels=800))  # 800^2 x 36 per layer
    with pytest.raises(CheckpointError, match=r"describes p4cnn with [\d,]+ parameters .*; this server builds at "
                                              rf"most {MAX_PARAMETERS:,}"):
        load_checkpoint(path)
    assert "this server builds at most" in uploaded["said"]["many.safetensors"]
    assert uploaded["peak_mb"] < PEAK_BOUND_MB


def test_the_meta_build_counts_the_parameters_the_real_network_has():
    card = json.loads(SHIPPED.with_suffix(".json").read_text())
    planned = planned_state(card, "the shipped p4cnn")
    model, _ = load_checkpoint(SHIPPED)
    assert planned == {name: ({torch.float32: "F32", torch.int64: "I64"}[t.dtype], tuple(t.shape))
                       for name, t in model.state_dict().items()}
    assert sum(p.numel() for p in model.parameters()) == card["parameters"]
    for arch in list_models():  # every registered architecture, its default config
        config = dataclasses.asdict(model_info(arch).config)
        assert {k: shape for k, (_, shape) in planned_state({"arch": arch, "config": config}, arch).items()} == \
            signature(arch), arch


def test_a_header_that_disagrees_with_the_config_is_refused(tmp_path):
    weights = load_file(str(SHIPPED))  # p4cnn with 10 channels, under a card that says 11
    path = card_only_checkpoint(tmp_path / "other.safetensors", card_with(channels=11), weights)
    with pytest.raises(CheckpointError, match=r"other.safetensors does not fit p4cnn: wrong shapes \['bn1.bias "
                                              r"\(10,\) != \(11,\)'"):
        load_checkpoint(path)


def test_a_header_that_disagrees_with_the_file_size_is_refused(tmp_path):
    data = SHIPPED.read_bytes()
    truncated, padded = tmp_path / "truncated.safetensors", tmp_path / "padded.safetensors"
    truncated.write_bytes(data[:-4])
    padded.write_bytes(data + b"\0" * 4096)
    held = len(data) - 8 - int.from_bytes(data[:8], "little")
    for path, extra in ((truncated, -4), (padded, 4096)):
        with pytest.raises(CheckpointError, match=rf"its header's tensors take {held:,} bytes, but the file holds "
                                                  rf"{held + extra:,} bytes of data after the header"):
            read_safetensors_header(path)


def test_a_header_claiming_more_than_the_file_holds_is_refused_before_reading(tmp_path):
    path = tmp_path / "claims.safetensors"
    header = json.dumps({"c1.weight": {"dtype": "F32", "shape": [2**20, 2**20], "data_offsets": [0, 2**42]}})
    path.write_bytes(len(header).to_bytes(8, "little") + header.encode() + b"\0" * 16)
    with pytest.raises(CheckpointError, match="its header's tensors take 4,398,046,511,104 bytes, but the file holds "
                                              "16 bytes"):
        read_safetensors_header(path)
    path.write_bytes((2**40).to_bytes(8, "little") + b"{}")
    with pytest.raises(CheckpointError, match="its header claims 1,099,511,627,776 bytes"):
        read_safetensors_header(path)


def test_a_deflate_bomb_pth_is_refused_before_torch_load(tmp_path, monkeypatch, uploaded):
    assert uploaded["sizes"]["bomb.pth"] < 2 * 2**20  # small on disk, 256 MiB inflated
    limit = f"the limit is {MAX_PTH_BYTES // 2**20} MB"
    assert uploaded["said"]["bomb.pth"] == f"bomb.pth would inflate to 256 MB when loaded; {limit}"
    assert uploaded["peak_mb"] < PEAK_BOUND_MB
    bomb = deflate_bomb(tmp_path / "bomb.pth", elements=2**26)
    assert sum(m.file_size for m in zipfile.ZipFile(bomb).infolist()) > MAX_PTH_BYTES

    def never(*args, **kwargs):
        raise AssertionError("torch.load was reached")

    monkeypatch.setattr(torch, "load", never)
    with pytest.raises(CheckpointError, match=f"would inflate to 256 MB when loaded; {limit}"):
        import_reference_checkpoint(bomb)


def test_a_pth_member_inflating_beyond_the_ratio_is_refused(tmp_path):
    bomb = deflate_bomb(tmp_path / "small_bomb.pth", elements=2**22)  # 16 MiB: under the total, far over the ratio
    with pytest.raises(CheckpointError, match=rf"inflates [\d,]+ bytes to 16,777,216 \(over {MAX_INFLATION:g} "
                                              "times\\)"):
        check_pth_archive(bomb)


def test_a_plain_torch_save_passes_the_archive_check(tmp_path):
    path = tmp_path / "plain.pth"
    torch.save(load_file(str(SHIPPED)), path)
    check_pth_archive(path)  # stored members: inflation 1


def test_any_error_while_loading_an_upload_becomes_a_sentence(monkeypatch):
    import app.analysis.checkpoints as checkpoints

    def fails(path):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can't allocate memory\nmore")

    monkeypatch.setattr(checkpoints, "load_checkpoint", fails)
    with pytest.raises(CheckpointError) as caught:
        checkpoints.load_uploaded_checkpoint(SHIPPED.read_bytes(), "mine.safetensors")
    assert str(caught.value) == ("mine.safetensors cannot be loaded (RuntimeError: [enforce fail at alloc_cpu.cpp:121] "
                                 "DefaultCPUAllocator: can't allocate memory)")


def test_weights_of_another_float_width_still_load_but_not_integers_for_floats(tmp_path):
    weights = load_file(str(SHIPPED))
    card = json.loads(SHIPPED.with_suffix(".json").read_text())
    card.pop("weights_sha256")
    doubled = {k: v.double() if v.is_floating_point() else v for k, v in weights.items()}
    model, _ = load_checkpoint(card_only_checkpoint(tmp_path / "double.safetensors", card, doubled))
    assert torch.equal(model.state_dict()["c1.weight"], weights["c1.weight"].double().float())
    wrong = {**weights, "c1.weight": weights["c1.weight"].to(torch.int32)}
    with pytest.raises(CheckpointError, match=r"int.safetensors does not fit p4cnn: wrong dtypes \['c1.weight I32 "
                                              r"!= F32'\]"):
        load_checkpoint(card_only_checkpoint(tmp_path / "int.safetensors", card, wrong))


def test_a_legacy_pth_declaring_a_huge_storage_is_refused_in_little_memory(uploaded):
    # The legacy format is not a zip: torch.load allocates the declared 8 GiB without touching it, then refuses the
    # storage's size against the file's; nothing is resident.
    assert uploaded["sizes"]["legacy.pth"] < 8192
    assert uploaded["said"]["legacy.pth"].startswith("legacy.pth is not a loadable PyTorch state dict (storage has "
                                                     "wrong byte size")
    assert uploaded["peak_mb"] < PEAK_BOUND_MB


def test_the_page_says_each_hostile_upload_in_a_sentence(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("APP_CHECKPOINTS", str(tmp_path / "none_shipped"))  # the page opens on the upload
    at = AppTest.from_file(str(REPO / "app" / "main.py"), default_timeout=120).run()
    wide = card_only_checkpoint(tmp_path / "wide.safetensors", card_with(channels=20000))
    bomb = deflate_bomb(tmp_path / "bomb.pth", elements=2**26)
    for path, said in ((wide, "model card of wide.safetensors: config field 'channels' is 20000, outside 1..1024"),
                       (bomb, "bomb.pth would inflate to 256 MB when loaded")):
        upload = (path.name, path.read_bytes(), "application/octet-stream")
        at = at.sidebar.file_uploader(key="checkpoint_upload").set_value(upload).run()
        assert not at.exception
        assert [e.value for e in at.error][0].startswith(f"Cannot use this checkpoint: {said}")
