"""Whole slides: one reader for vendor slides and ordinary images (:mod:`.reader`), the scale rules (:mod:`.scale`),
where the tissue is (:mod:`.tissue`) and any block of a slide at the model's scale, equal to region mode's whole
resampling (:mod:`.resample`). Numpy in, numpy out; no Streamlit.

The first pieces of the whole-slide work (issue 59): the engine over a slide's cells, its store, the viewer and
``python -m app.slides`` build on these; a cohort of slides on a Dask cluster (issue 60) is :mod:`.cohort`, where
its chunks run (a worker's GPU or CPU) :mod:`.workers`, and the code's hash in its summary :mod:`.provenance`.
The cells' evaluator is :mod:`app.cells`'s; nothing here imports :mod:`app.region`.
"""
