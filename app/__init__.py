"""The attention-map explorer: a Streamlit page (``app/main.py``) over packages whose imports run one way.

* :mod:`app.analysis`: numbers from images and models (the batched forward pass, maps, proofs, Grad-CAM,
  nuclei, checkpoints and images read in); imports :mod:`models` only;
* :mod:`app.pictures`: what the numbers look like (arrow fields, colour ranges, plotly and PNG figures, the NPZ
  export of what is drawn); imports :mod:`app.analysis`;
* :mod:`app.gallery`: the built-in images and their manifest; its maker imports :mod:`app.analysis`;
* :mod:`app.cells`: a region's or a slide's cells, the one evaluator both run, and the scored PCam mosaic; imports
  :mod:`app.analysis` and the gallery;
* :mod:`app.slides`: whole slides (reader, scale, tissue, the engine on Dask, the store, the tiles, ``python -m
  app.slides``); imports :mod:`app.cells` and :mod:`app.analysis`;
* :mod:`app.region`: region mode's pictures and ``python -m app.region``; imports the cells, the pictures and the
  slide reader;
* :mod:`app.ui`: the Streamlit widgets and pages; imports everything above. ``app/main.py`` is the entry.

Nothing imports upwards in that list, nothing outside :mod:`app.ui` and ``main.py`` imports Streamlit, and no
module imports :mod:`training` (``tests/test_imports.py`` holds all of this; ``docs/architecture.md`` shows it).
"""
