"""From a path on disk to a ready model: the loading room.

Owner: ``metrale_core.loading``.  ``load`` (what the CLI and server call once at start-up),
``model_build`` (store -> model through the loader plugin; the engine builds side models with it),
``activation_probe`` (the GGUF activation precision chosen at load) and ``embedded`` (the default
model shipped in the wheel).

Invariants: importing the package imports none of its modules (no torch).
"""
