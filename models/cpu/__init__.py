"""The optional CPU fast paths: the layers' concepts (``models.gconv``, ``models.attention``, the architectures)
call them where they apply, and each computes the same function as a PyTorch path that runs where it does not.

* compiled C++ kernels, built with the machine's compiler on first use and cached (:mod:`.native_build`):
  the full attentive convolution's maxima and branch (:mod:`.attention_kernels`), alpha_F's big-tensor steps
  (:mod:`.input_attention_kernels`), the DenseNets' ``relu(bn(cat(parts)))`` (:mod:`.relu_bn`), and the PCam
  networks' bfloat16 channels-last inference between oneDNN's convolutions (:mod:`.bfloat16_kernels`);
* large 3x3 convolutions in inference through NNPACK (:mod:`.nnpack`);
* the allocator setting that keeps freed memory in the process (:mod:`.allocator`);
* where the project caches what it builds or decodes on a machine (:mod:`.user_cache`).

The bottom layer of the library: it imports nothing else of the project (``tools/import_rules.py``).
"""
