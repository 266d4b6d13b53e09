"""Region mode: a whole H&E region judged cell by cell, as PCam judges a patch.

``evaluation`` (the grid, crops or tiles through the network, exact under the group: the cell evaluator the slide
engine runs too) and ``demo`` (the scored mosaic of PCam test patches) are pure computations; ``overlays`` turns a
result into what is drawn (the probability surface on tissue, its 0.5 contour, the attention's colour range), which
``figures`` draws as PNG; ``cli`` is ``python -m app.region`` (run through ``__main__``), which reads its region
through the slide reader. In the app, regions are images on the Slide page (:mod:`app.ui.slide_page`): one reader,
one grid, one engine and one page for images and slides.

May import: :mod:`app.analysis`, :mod:`app.pictures`, :mod:`app.gallery`, :mod:`app.slides` (its reader), :mod:`models`.
``evaluation`` and ``demo`` import no pictures. Never Streamlit or :mod:`app.ui`.
"""
