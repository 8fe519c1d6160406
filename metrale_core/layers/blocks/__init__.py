"""Family-specific decoder blocks: mixture-of-experts routing and experts (``moe``) and
multi-head latent attention in the absorbed form (``mla``).

Owner: ``metrale_core.layers``.  Invariants: importing the package imports none of its modules.
"""
