"""Region mode: a whole H&E region judged cell by cell, as PCam judges a patch.

``evaluation`` (the grid, crops or tiles through the network, exact under the group) and ``demo`` (the scored
mosaic of the model's PCam test patches) are pure computations; ``overlays`` turns a result into what is drawn
(the probability surface on tissue, its 0.5 contour, truth marks, the attention's colour range), which
``figures`` (PNG) and ``plots`` (plotly, for the page) draw; ``cli`` is ``python -m app.region`` (run through
``__main__``).

May import: :mod:`app.analysis`, :mod:`app.pictures`, :mod:`app.gallery`, :mod:`models`. ``evaluation`` and
``demo`` import no pictures. Never Streamlit or :mod:`app.ui`: the region page lives in :mod:`app.ui.region_page`.
"""
