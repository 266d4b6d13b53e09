"""Region mode: a whole H&E region judged cell by cell, as PCam judges a patch, and drawn.

The cells and their evaluation are :mod:`app.cells` (the evaluator the slide engine runs too, and the scored PCam
mosaic); here ``overlays`` turns a result into what is drawn (the probability surface on tissue, its 0.5 contour,
the attention's colour range), which ``figures`` draws as PNG; ``cli`` is ``python -m app.region`` (run through
``__main__``), which reads its region through the slide reader and adds to ``python -m app.slides IMAGE`` the
full-resolution pictures (the probability surface and the attention map in each reading) and, for a model without
attention, the shared trunk over tiles. In the app, regions are images on the Slide page
(:mod:`app.ui.slide_page`): one reader, one grid, one engine and one page for images and slides.

May import: :mod:`app.cells`, :mod:`app.analysis`, :mod:`app.pictures`, :mod:`app.gallery`, the slide reader
(``cli``), :mod:`models`. Never Streamlit or :mod:`app.ui`; nothing in :mod:`app.slides` imports this package.
"""
