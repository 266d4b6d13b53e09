"""``streamlit run app/server.py`` (``make run``, the Docker image): the app, ready before its first visitor.

The page of ``app/main.py``, served by Streamlit's ``st.App`` (Starlette) with a start-up hook: before the server
answers its first request (its health check included), :func:`app.ui.first_visit.prepare_first_visit` imports the
page's modules and computes the default page's numbers into the caches the page reads. The first visitor then
waits as the second does (1.8 s less of server time with AVX2 code; docs/app.md has the browser's figures).
Beside the page, on the same port, the slides' deep-zoom tiles (:mod:`app.slides.tiles`), which the Slide page's
viewer fetches without rerunning anything. The slides' Dask client (a local cluster, or ``$AAGC_DASK_SCHEDULER``'s)
is made beside the preparation, before the first request, and closed when the server stops.
``streamlit run app/main.py`` still serves the same page, without the preparation and without tiles.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

if __package__ in (None, ""):
    # `streamlit run app/server.py` puts app/ on sys.path, not the repository root.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import streamlit as st  # noqa: E402

from app.slides.tiles import slide_routes  # noqa: E402

# Caches used outside a script run warn once per call that there is no script run; here that is the point.
QUIET_WHILE_PREPARING = "streamlit.runtime.scriptrunner_utils.script_run_context"
CLUSTER_WAIT_S = 30.0  # the longest the server waits for the slides' Dask client before it answers


@contextlib.asynccontextmanager
async def ready_before_the_first_visitor(_app):
    # Imported here, once Streamlit's runtime runs (the page's caches then find it), and run in the event loop's
    # own thread on purpose: nothing is served until it is done.
    started = time.perf_counter()
    from app.ui.slide_page import close_dask_client, start_dask_client

    # The slides' Dask cluster starts now, in its own thread beside the preparation, and the server answers once
    # it is up (or after CLUSTER_WAIT_S): a local cluster's start, TLS and the worker's PyTorch import, is 6-15 s of
    # CPU on two cores. Started from the Slide page (as it was), it came after the slide's plan and before the
    # analysis, so Analyse waited 10-24 s for the first cells; started as the server answers, it took the cores
    # from the first visitor's pages. Before the first request it costs no visitor a wait.
    cluster = start_dask_client()
    from app.ui.first_visit import prepare_first_visit

    quiet = logging.getLogger(QUIET_WHILE_PREPARING)
    level, _ = quiet.level, quiet.setLevel(logging.ERROR)
    try:
        prepared = prepare_first_visit()
    finally:
        quiet.setLevel(level)
    log = logging.getLogger("app.server")
    log.warning("first visit prepared in %.1f s, imports included: %s", time.perf_counter() - started, prepared)
    try:
        cluster.result(timeout=CLUSTER_WAIT_S)
        log.warning("the slides' Dask client ready %.1f s after the start", time.perf_counter() - started)
    except FutureTimeout:
        log.warning("the slides' Dask client still connecting after %.0f s: the Slide page says so", CLUSTER_WAIT_S)
    except Exception as err:  # noqa: BLE001  (the Slide page says why, and tries again on Analyse)
        log.warning("the slides' Dask client did not connect: %s", err)
    yield
    close_dask_client()  # the slides' local Dask cluster, where the Slide page started one


app = st.App("main.py", lifespan=ready_before_the_first_visitor, routes=slide_routes())
