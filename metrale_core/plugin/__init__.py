"""How plugins are declared, found and called: the plugin room.

Owner: ``metrale_core.plugin``.  ``hookspecs`` (the pluggy hook specifications) and ``hookdoc``
(their reference text), ``components`` (the ``*Spec`` records a hook returns), ``discovery``
(entry-point discovery and ``load_registry``), ``registry`` (the typed facade over the plugin
manager) and ``builtins`` (core's own implementations of the hooks).

The marker of hook specifications, :data:`hookspec`, is defined here so every hook family module
(``hookspecs``, ``hooks_registration``) marks its specs with the one project name.

Invariants: importing the package imports none of its modules (no torch); nothing here imports
the engine (import-linter's ``engine-not-imported-below``).
"""

from __future__ import annotations

import pluggy

#: Marker for hook specifications (used only by the hook family modules of this package).
hookspec = pluggy.HookspecMarker("metrale")
