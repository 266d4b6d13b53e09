"""The app's numbers: numpy in, numpy out, no Streamlit and no drawing library.

Images read and fitted to a model (``images``), group elements applied to them (``transforms``), the model's
input frame (``frames``), attention reduced to one map per orientation (``reductions``), the batched forward
pass over every group transform with its live proof (``compute``), arbitrary angles (``angles``), the padding
border (``padding``), Grad-CAM of a plain CNN (``gradcam``), attention on nuclei (``nuclei``), what an H&E model
is (``pathology``), checkpoints listed and loaded (``checkpoints``), the paper's releases beside ours
(``releases``) and the shared LRU of analyses (``cache``). The allocator setting the app makes at start-up is
:mod:`models.cpu.allocator`'s.

May import: :mod:`models`, the standard library, numpy, torch, Pillow, safetensors. Never another ``app``
package, never Streamlit, never :mod:`training`: everything here can run in a script or a test.
"""
