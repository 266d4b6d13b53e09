"""The attention-map explorer: pure compute (this package, numpy in, numpy out) under a thin Streamlit UI.

Modules, one concept each:

* :mod:`app.images`: uploaded bytes -> float image in [0, 1], fitted to a model's input;
* :mod:`app.transforms`: group elements and arbitrary rotations applied to image arrays;
* :mod:`app.frames`: the model's input convention (normalisation, transposition) and
  the way back from the network's frame to the user's image frame;
* :mod:`app.reductions`: attention parts and feature maps -> one 2-D map per orientation;
* :mod:`app.compute`: one batched forward pass for every group transform, the maps and
  the live equivariance proof;
* :mod:`app.angles`: the measured deviation for rotations by arbitrary angles;
* :mod:`app.arrows`: arrow fields of orientation responses;
* :mod:`app.figures`: PNG renderings (matplotlib, Agg) of maps and arrow fields;
* :mod:`app.export`: NPZ export;
* :mod:`app.cache`: a small LRU of analyses;
* :mod:`app.checkpoints`: listing shipped checkpoints, loading uploaded ones.

No module here imports Streamlit or :mod:`training`.
"""
