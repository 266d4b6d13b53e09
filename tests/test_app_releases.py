"""Ours against the paper's: an uploaded release of the paper's code beside our shipped checkpoint on the same
image, with no architecture named by hand."""


import pytest
from conftest import REPO, release_path
from test_app_ui import MAIN, ok

from app.analysis.checkpoints import list_checkpoints
from app.analysis.readings import BRIGHT
from app.analysis.releases import counterparts, is_release
from models.reference_import import reference_card

streamlit_testing = pytest.importorskip("streamlit.testing.v1")

SHIPPED = REPO / "checkpoints"
needs_shipped = pytest.mark.skipif(not (SHIPPED / "fa_p4m_densenet_pcam.safetensors").exists(),
                                   reason="the shipped PCam checkpoints are absent")


@needs_shipped
def test_counterparts_put_our_attentive_model_of_the_same_group_first():
    entries = list_checkpoints(SHIPPED)
    assert [e.name for e in counterparts(reference_card("p4m_densenet"), entries)] == [
        "fa_p4m_densenet_pcam", "p4m_densenet_pcam", "fa_p4_densenet_pcam"]  # p4m first, attentive first
    digits = [e.name for e in counterparts(reference_card("a_p4cnn"), entries)]
    assert digits[0] == "a_p4cnn_rot_mnist" and "z2cnn_rot_mnist" == digits[-1]
    assert [e.name for e in counterparts(reference_card("z2cnn"), entries)][0] == "z2cnn_rot_mnist"
    assert is_release(reference_card("z2cnn")) and not any(is_release(e.card) for e in entries)


@needs_shipped
def test_the_paper_pcam_release_beside_ours(monkeypatch):
    monkeypatch.setenv("APP_CHECKPOINTS", str(SHIPPED))
    at = ok(streamlit_testing.AppTest.from_file(MAIN, default_timeout=240).run())
    at = ok(at.sidebar.radio(key="model_source").set_value("Upload a checkpoint").run())
    upload = ("model.pth", release_path("p4m_densenet").read_bytes(), "application/octet-stream")
    at = ok(at.sidebar.file_uploader(key="checkpoint_upload").set_value(upload).run())
    assert not [box for box in at.sidebar.selectbox if box.key == "pth_arch"]  # found from its weights
    at.session_state["tab"] = "Ours against the paper's"  # computed when opened
    at = ok(at.run())
    assert "<small>**model.pth** · p4m_densenet · p4m · pcam · the paper's log: test error 10.88 %</small>" in (
        at.markdown[1].value)
    assert at.metric[0].label == "Prediction" and at.metric[0].value in ("tumor", "no_tumor")
    assert at.selectbox(key="paper_vs_ours").value == "fa_p4m_densenet_pcam"
    text = " ".join(m.value for m in at.markdown)
    assert "**The paper's release: model.pth**" in text and "**Ours: fa_p4m_densenet_pcam**" in text
    assert "Both predict" in text or "They disagree" in text
    lacks = [i.value for i in at.info if i.value.startswith("model.pth (p4m_densenet) has no attention layer")]
    assert lacks == ["model.pth (p4m_densenet) has no attention layer. Released as 'f_att_p4m_densenet', but the "
                     "paper's code built a plain P4MDenseNet for that name: no attention. Shown is what it has: the "
                     "response strength of c1, its first convolution with an orientation axis."]
    assert not at.exception and not at.error
    # Our attention in the reading picked beside it: alpha_s first, as on the patch page.
    assert at.selectbox(key="paper_vs_ours_reading").value == "spatial"
    assert BRIGHT["spatial"] in " ".join(c.value for c in at.caption)
    at = ok(at.selectbox(key="paper_vs_ours_reading").set_value("kept").run())
    captions = " ".join(c.value for c in at.caption)
    assert BRIGHT["kept"] in captions and BRIGHT["spatial"] not in captions


@needs_shipped
def test_the_app_opens_on_the_most_accurate_attentive_he_model():
    from app.ui.inputs import default_checkpoint

    entries = list_checkpoints(SHIPPED)
    assert entries[default_checkpoint(entries)].name == "fa_p4m_densenet_pcam"  # not fa_p4, first by name
    plain_first = sorted(entries, key=lambda e: e.name != "p4m_densenet_pcam")
    assert plain_first[default_checkpoint(plain_first)].name == "fa_p4m_densenet_pcam"  # attentive before plain
