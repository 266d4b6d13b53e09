"""The attention-map explorer: a Streamlit page (``app/main.py``) over packages whose imports run one way.

* :mod:`app.analysis`: numbers from images and models (the batched forward pass, maps, proofs, Grad-CAM,
  nuclei, checkpoints and images read in); imports :mod:`models` only;
* :mod:`app.pictures`: what the numbers look like (arrow fields, colour ranges, plotly and PNG figures, the NPZ
  export of what is drawn); imports :mod:`app.analysis`;
* :mod:`app.gallery`: the built-in images and their manifest; its maker imports :mod:`app.analysis`;
* :mod:`app.region`: a whole H&E region cell by cell, its pictures and ``python -m app.region``; imports the
  three above;
* :mod:`app.ui`: the Streamlit widgets and pages; imports everything above. ``app/main.py`` is the entry.

Nothing imports upwards in that list, nothing outside :mod:`app.ui` and ``main.py`` imports Streamlit, and no
module imports :mod:`training` (``tests/test_imports.py`` holds all of this; ``docs/architecture.md`` shows it).
"""
