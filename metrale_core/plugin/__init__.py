"""How plugins are declared, found and called: the plugin room.

Owner: ``metrale_core.plugin``.  ``hookspecs`` (the pluggy hook specifications) and ``hookdoc``
(their reference text), ``components`` (the ``*Spec`` records a hook returns), ``discovery``
(entry-point discovery and ``load_registry``), ``registry`` (the typed facade over the plugin
manager) and ``builtins`` (core's own implementations of the hooks).

The marker of hook specifications, :data:`hookspec`, is defined here so every hook family module
(``hookspecs``, ``hooks_registration``) marks its specs with the one project name;
:func:`plain_hookspec` marks the common kind (plain, return value ignored) and writes the
``Returns:`` and ``Flags:`` sections such a spec's docstring shares with every other one.

Invariants: importing the package imports none of its modules (no torch); nothing here imports
the engine (import-linter's ``engine-not-imported-below``).
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from typing import TypeVar

import pluggy

_F = TypeVar("_F", bound=Callable)

#: Marker for hook specifications (used only by the hook family modules of this package).
hookspec = pluggy.HookspecMarker("metrale")

_PLAIN_SECTIONS = (
    "Returns:\n    Nothing; the return value is ignored.{note}\n\n"
    "Flags:\n    plain hook (not firstresult, not historic): every plugin's implementation runs.\n\n"
)
_HEADER = r"^([ \t]*){}:[ \t]*$"


def plain_hookspec(note: str = "") -> Callable[[_F], _F]:
    """:data:`hookspec` for a plain hook (not firstresult, not historic) whose implementations'
    return values are ignored: adds those ``Returns:`` (with ``note`` after the common sentence)
    and ``Flags:`` sections before the ``Example:`` of the spec's docstring, which leaves them out."""

    def mark(fn: _F) -> _F:
        doc = fn.__doc__ or ""
        example = re.search(_HEADER.format("Example"), doc, re.M)
        if example is None or re.search(_HEADER.format("(Returns|Flags)"), doc, re.M):
            raise ValueError(f"{fn.__name__}: a plain hookspec's docstring has Example: and no Returns: / Flags:")
        sections = textwrap.indent(_PLAIN_SECTIONS.format(note=f" {note}" if note else ""), example.group(1))
        fn.__doc__ = doc[: example.start()] + sections + doc[example.start() :]
        return hookspec(fn)

    return mark
