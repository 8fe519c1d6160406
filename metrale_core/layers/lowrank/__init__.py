"""LoRA: the per-row adapter wrapper (``lora``) and the projections a model declares as targets
(``lora_targets``).

Owner: ``metrale_core.layers``.  Invariants: importing the package imports none of its modules.
"""
