"""A registration hook written as data: ``metrale_executors = registers(ExecutorSpec(...))``.

Owner: ``metrale_core.plugin``.  Most plugins implement a registration hook
(:mod:`metrale_core.plugin.hooks_registration`) only to pass fixed records to ``register``;
:func:`registers` is that hook, so a plugin module states its records once instead of writing the
same ``@hookimpl`` function around them.  Assign the result to the hook's name in the plugin
module: pluggy matches a hook implementation by the module attribute's name.

Invariants: the returned function is marked with ``metrale_core.hookimpl`` and, when the hook is
called, passes the records to ``register`` in the order given, once each call; it imports
nothing beyond ``metrale_core`` (a plugin's ``__init__`` stays light).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from metrale_core import hookimpl

__all__ = ["registers"]


def registers(*specs: Any) -> Callable[[Callable[[Any], None]], None]:
    """Return a registration hook implementation that registers ``specs`` in order."""
    if not specs:
        raise ValueError("registers() needs at least one record to register")
    names = ", ".join(repr(getattr(spec, "name", spec)) for spec in specs)

    @hookimpl
    def registration_hook(register: Callable[[Any], None]) -> None:
        for spec in specs:
            register(spec)

    registration_hook.__doc__ = f"Register {names}."
    return registration_hook
