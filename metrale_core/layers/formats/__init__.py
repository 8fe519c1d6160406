"""Linear layers in their weight formats: the builder (``linear``), the layer kinds
(``linear_kinds``), GGUF block formats, repacking and matmul (``gguf_blocks``, ``gguf_repack``,
``gguf_linear``), the CPU block-quantized matmul (``cpu_qmatmul``), the per-row matmul
(``rows_matmul``) and the on-disk repack cache (``repack_cache``).

Owner: ``metrale_core.layers``.  Invariants: importing the package imports none of its modules;
the public names are exported by :mod:`metrale_core.layers`.
"""
