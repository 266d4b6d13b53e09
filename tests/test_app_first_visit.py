"""The first visitor's page is prepared before they come (``app/server.py``, :mod:`app.ui.first_visit`): the page's
first run then computes nothing that the preparation computed, and a folder it cannot prepare only says why."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

import app.ui.caches as caches
from app.ui.first_visit import prepare_first_visit
from benchmarks.concurrent_sessions import free_port, streamlit_server
from tests.conftest import REPO

AppTest = pytest.importorskip("streamlit.testing.v1").AppTest

DEFAULT = "fa_p4m_densenet_pcam"  # the attentive H&E model the app opens on (app.ui.inputs.default_checkpoint)


@pytest.fixture
def counted_analyses(monkeypatch):
    """Every analysis the page's cache computes (not those it finds), by image digest; the cache starts empty."""
    computed = []
    real = caches.analyse

    def counting(model, card, image, element, selections):
        computed.append((card["arch"], element))
        return real(model, card, image, element, selections)

    monkeypatch.setattr(caches, "analyse", counting)
    caches.analyses.clear()
    yield computed
    caches.analyses.clear()


@pytest.fixture
def shipped_default(tmp_path, monkeypatch) -> Path:
    """A checkpoint folder holding the shipped default model alone, as ``$APP_CHECKPOINTS``."""
    for suffix in (".safetensors", ".json"):
        shutil.copy(REPO / "checkpoints" / f"{DEFAULT}{suffix}", tmp_path / f"{DEFAULT}{suffix}")
    monkeypatch.setenv("APP_CHECKPOINTS", str(tmp_path))
    return tmp_path


def test_the_first_page_finds_its_analysis_prepared(shipped_default, counted_analyses):
    said = prepare_first_visit()
    assert said == f"{DEFAULT} on pcam_tumour_0a5f22f6a5.jpg is ready" and counted_analyses == [("fa_p4m_densenet", 0)]
    at = AppTest.from_file(str(REPO / "app" / "main.py"), default_timeout=120).run()
    assert not at.exception and [m.label for m in at.metric] == ["Prediction"]
    assert counted_analyses == [("fa_p4m_densenet", 0)], "the first page computed its analysis again"


def test_without_the_preparation_the_first_page_computes_it(shipped_default, counted_analyses):
    """The check above can fail: the page's own run computes the same analysis when nothing prepared it."""
    AppTest.from_file(str(REPO / "app" / "main.py"), default_timeout=120).run()
    assert counted_analyses == [("fa_p4m_densenet", 0)]


def test_a_folder_it_cannot_prepare_says_why(tmp_path, counted_analyses):
    assert prepare_first_visit(tmp_path) == "no checkpoint to prepare: the page will say how to add one"
    (tmp_path / "broken.safetensors").write_bytes(b"not a checkpoint")
    said = prepare_first_visit(tmp_path)
    assert said.startswith("broken not prepared: ") and counted_analyses == []


def test_the_server_answers_once_the_first_visit_is_prepared(tmp_path):
    """``streamlit run app/server.py``: its health check answers only after the start-up hook has run, and the
    slides' Dask cluster is up by then."""
    log = tmp_path / "server.log"
    with streamlit_server(REPO / "checkpoints", log, free_port(), time.monotonic() + 120):
        text = log.read_text()
    assert "first visit prepared in " in text and f"{DEFAULT} on pcam_tumour_0a5f22f6a5.jpg is ready" in text
    assert "the slides' Dask client ready " in text, "the slides' local cluster up before the first request"
    assert "Traceback" not in text and "No runtime found" not in text and "missing ScriptRunContext" not in text
