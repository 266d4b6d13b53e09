"""What the analysis looks like: arrow fields (``arrows``), colour ranges and overlays (``map_style``), the
page's plotly figures (``plots``), PNG renderings with matplotlib's Agg canvas (``figures``) and the NPZ export
of what is drawn (``export``).

May import: :mod:`app.analysis`, :mod:`models`, numpy, matplotlib, plotly. Never Streamlit, :mod:`app.region`
or :mod:`app.ui`: a picture is a value a page shows, not a widget.
"""
