"""A region's or a slide's cells: the one evaluator both run, below both (issue 68's one path).

``evaluation`` is the grid of 32-pixel cells at the model's scale, each judged in its 96-pixel context, the tissue
share that decides which are evaluated, the palindromic tiles and the network over cells (:func:`.evaluation
.evaluate_cells`, :func:`.evaluation.evaluate_region`); ``mosaic`` is the PCam test mosaic, whose cells' truth is
known, and the score of a heatmap against it. Region mode (:mod:`app.region`: its pictures and ``python -m
app.region``) and the slide engine (:mod:`app.slides.engine`) import these; nothing here imports either.

May import: :mod:`app.analysis`, :mod:`app.gallery` (``mosaic``: the gallery's test patches where pcam_public is not
reachable), :mod:`models`. No pictures, never Streamlit or :mod:`app.ui`.
"""
