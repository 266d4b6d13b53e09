"""In Chromium: each of the paper's five releases uploaded with no architecture named, and three bad files, each
with its message and none with a traceback; the app healthy after. The PCam release's page and its side-by-side
view with ours are saved as screenshots (``out/`` with ``SAVE_SCREENSHOT=1``)."""

from __future__ import annotations

import json
import pickle
import urllib.request
from pathlib import Path

from conftest import RELEASES, REPO, release_path
from safetensors.torch import save_file
from test_app_browser import FIRST_SCREEN, app_page, check_and_keep, scroll_to

import models
from models.checkpoint import CARD_KEY

UPLOADER = '[data-testid="stFileUploader"] input[type="file"]'


def no_traceback(page) -> None:
    assert page.locator('[data-testid="stException"]').count() == 0
    assert "Traceback" not in page.inner_text("body")


def bad_files(folder: Path) -> list[tuple[Path, str]]:
    """A pickle that would run code, a safetensors whose header lies about its length, and a safetensors of
    p4cnn weights whose card says a_p4cnn; each with the message it must get."""
    evil = folder / "evil.pth"
    evil.write_bytes(pickle.dumps({"c1.weight": Exploit()}))
    lying = folder / "lying.safetensors"
    lying.write_bytes((10**9).to_bytes(8, "little") + b'{"a": 1}')
    ours = folder / "a_p4cnn.safetensors"
    card = models.save_checkpoint(models.build_model("a_p4cnn"), ours, {
        "input": dict(size=28, channels=1, mean=[0.1307], std=[0.3081], transposed=False),
        "dataset": {"name": "rot_mnist"}, "class_names": [str(d) for d in range(10)], "metrics": {}})
    wrong = folder / "wrong.safetensors"
    save_file(dict(models.build_model("p4cnn").state_dict()), str(wrong),
              metadata={CARD_KEY: json.dumps(card)})  # p4cnn's weights, a_p4cnn's card
    return [(evil, "evil.pth is not a loadable PyTorch state dict"),
            (lying, "lying.safetensors is not a readable safetensors file"),
            (wrong, "wrong.safetensors does not fit a_p4cnn: missing")]


class Exploit:
    def __reduce__(self):
        import os
        return (os.system, ("echo pwned > pwned.txt",))


def test_releases_and_bad_files_in_chromium(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    releases = {arch: release_path(arch) for arch in RELEASES}
    with app_page(REPO / "checkpoints", tmp_path, FIRST_SCREEN) as page:
        page.get_by_text("Upload a checkpoint", exact=True).click()
        for arch, path in releases.items():
            page.locator(UPLOADER).first.set_input_files(str(path))
            page.get_by_text(f"Architecture, from its weights: {arch}.").wait_for()
            page.get_by_text("What the model sees").wait_for()
            page.get_by_text(f"· {arch} ·", exact=False).first.wait_for()
            assert "the paper's log: test error" in page.inner_text("body")
            no_traceback(page)
        # The PCam release was uploaded last: its page, then beside ours. The prediction is drawn after the header.
        page.get_by_text("P(tumor) =", exact=False).first.wait_for()
        body = page.inner_text("body")
        summary = next(line for line in body.splitlines() if "the paper's log" in line)
        assert "model.pth · p4m_densenet · p4m · pcam · the paper's log: test error 10.88 %" in summary, summary
        assert "tumor" in body
        page.screenshot(path=str(tmp_path / "paper_pcam_release.png"))
        page.get_by_role("tab", name="Ours against the paper's").click()
        page.get_by_text("Ours: fa_p4m_densenet_pcam").wait_for()
        # Streamlit scrolls inside its own container, which a full-page screenshot does not unroll: scroll to it.
        scroll_to(page.get_by_text("The paper's release: model.pth").first)
        page.wait_for_timeout(1500)  # let plotly paint
        page.screenshot(path=str(tmp_path / "paper_pcam_vs_ours.png"))
        no_traceback(page)
        for path, message in bad_files(tmp_path):
            page.locator(UPLOADER).first.set_input_files(str(path))
            page.get_by_text(message, exact=False).first.wait_for()
            no_traceback(page)
        health = page.url.rstrip("/") + "/_stcore/health"
        assert urllib.request.urlopen(health, timeout=10).read() == b"ok"
    assert not (tmp_path / "pwned.txt").exists()
    check_and_keep(tmp_path / "paper_pcam_release.png", "paper_pcam_release.png", FIRST_SCREEN)
    check_and_keep(tmp_path / "paper_pcam_vs_ours.png", "paper_pcam_vs_ours.png", FIRST_SCREEN)
