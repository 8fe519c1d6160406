"""Per-token layers: norms, RoPE and gated activations (the torch oracles in ``functional``, their
``CustomOp`` s in ``norm_ops`` and ``native_ops``).

Owner: ``metrale_core.layers``.  Invariants: importing the package imports none of its modules;
the public names are exported by :mod:`metrale_core.layers`.
"""
