"""How plugins are declared, found and called: the plugin room.

Owner: ``metrale_core.plugin``.  ``hookspecs`` (the pluggy hook specifications) and ``hookdoc``
(their reference text), ``components`` (the ``*Spec`` records a hook returns), ``discovery``
(entry-point discovery and ``load_registry``), ``registry`` (the typed facade over the plugin
manager) and ``builtins`` (core's own implementations of the hooks).

Invariants: importing the package imports none of its modules (no torch); nothing here imports
the engine (import-linter's ``engine-not-imported-below``).
"""
