"""The error boundary around every page: a fault shows a short message naming where it happened and what to do,
never a traceback, and the server log gets the traceback."""

import logging

import pytest
from test_app_ui import app as start_app
from test_app_ui import dev_folder  # noqa: F401  (the fixture)

from app.ui import views
from app.ui.boundary import ADVICE, failure_message, where_it_failed


def fail(*args, **kwargs):
    raise AttributeError("'str' object has no attribute 'get'")


def test_a_failing_view_shows_a_message_and_logs_the_traceback(dev_folder, monkeypatch, caplog):  # noqa: F811
    monkeypatch.setattr(views, "turn_viewer", fail)  # show_maps mounts its viewer with it
    with caplog.at_level(logging.ERROR, logger="app"):
        at = start_app(monkeypatch, dev_folder)
    assert not at.exception
    message, = [e.value for e in at.error]
    incident = message[-9:-1]
    assert message == (f"Something went wrong in show_maps (app/ui/views.py): AttributeError: 'str' object has no "
                       f"attribute 'get'. {ADVICE} (incident {incident})")
    record, = [r for r in caplog.records if r.name == "app"]
    assert record.getMessage() == f"incident {incident}: the page failed in show_maps (app/ui/views.py)"
    assert "Traceback" in caplog.text and "in fail" in caplog.text
    # The rest of the page is still there: the prediction came before the maps.
    assert [m.label for m in at.metric][:1] == ["Prediction"]


def test_the_app_serves_again_once_the_fault_is_gone(dev_folder, monkeypatch):  # noqa: F811
    monkeypatch.setattr(views, "turn_viewer", fail)
    at = start_app(monkeypatch, dev_folder)
    assert at.error
    monkeypatch.undo()
    monkeypatch.setenv("APP_CHECKPOINTS", str(dev_folder))
    at = at.run()
    assert not at.error and not at.exception


def test_the_message_names_the_innermost_frame_of_the_project():
    def outside():
        raise KeyError("dataset")

    try:
        outside()
    except KeyError as err:
        assert where_it_failed(err) == "outside (tests/test_app_boundary.py)"  # no frame of app/ or models/
        assert failure_message(err, "abc").startswith("Something went wrong in outside (tests/test_app_boundary.py): "
                                                      "KeyError: 'dataset'. Pick another image")
    with pytest.raises(ValueError) as raised:
        import models
        models.build_model("p9cnn")
    assert where_it_failed(raised.value) == "model_info (models/registry.py)"
