"""Plugin loading: find, import and register every plugin, then collect what each registers.

Owner: ``load_registry()`` builds a fresh ``pluggy.PluginManager("metrale")`` and a
:class:`~metrale_core.plugin.registry.Registry` from it; core code reads components from the registry,
never from ``pm.hook``.

Loading sequence (deterministic):
1. add the hookspecs (``metrale_core.plugin.hookspecs``);
2. register the core's built-ins (``metrale_core.plugin.builtins``) exactly like a plugin;
3. load entry points of group ``metrale`` (sorted by name), one at a time, honouring
   ``METRALE_PLUGINS`` (allow-list of entry-point names; set but empty = no external plugins),
   ``METRALE_DISABLE_PLUGINS`` (block-list, via ``pm.set_blocked``) and
   ``METRALE_STRICT_PLUGINS=1`` (an import failure raises instead of warning);
4. ``pm.check_pending()``: a misspelled hook is a :class:`PluginError` naming the hook;
5. call each registration hook once per plugin with a ``register`` that knows the plugin.

Invariants:
- A plugin that fails (import or registration hook) is unregistered and contributes nothing; it
  is still listed in ``Registry.plugins`` with ``error`` set. Other plugins are unaffected.
- A component name is unique within its family; a second registration raises
  :class:`DuplicateComponent` naming both distributions.
- Nothing here runs per token: the engine resolves specs to plain objects when it is built.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import os
from collections.abc import Callable, Iterable
from typing import Any

import pluggy
from attrs import define, evolve, field, frozen
from loguru import logger

from metrale_core.errors import DuplicateComponent, PluginError, PluginImportError
from metrale_core.plugin.registry import (
    FAMILIES,
    GROUP,
    PluginInfo,
    Registry,
    call_for,
    new_plugin_manager,
    singular,
)

__all__ = ["FAMILIES", "LazyFactory", "PluginInfo", "Registry", "lazy_factory", "load_registry"]

BUILTINS = ("builtins", "metrale_core.plugin.builtins")  # plugin name, module


@frozen
class LazyFactory:
    """A factory named ``"package.module:attr"``, imported only when first called."""

    target: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module, _, attr = self.target.partition(":")
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj(*args, **kwargs)


def lazy_factory(target: str) -> LazyFactory:
    """Return a factory that imports ``target`` (``"pkg.mod:Attr"``) when it is called."""
    if ":" not in target:
        raise ValueError(f"lazy factory target {target!r} must look like 'package.module:attr'")
    return LazyFactory(target)


def _env_names(var: str) -> list[str] | None:
    value = os.environ.get(var)
    if value is None:
        return None
    return [name.strip() for name in value.split(",") if name.strip()]


def _strict() -> bool:
    return os.environ.get("METRALE_STRICT_PLUGINS", "").strip().lower() in {"1", "true", "yes", "on"}


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _collect(pm: pluggy.PluginManager, plugin: object) -> dict[str, list[Any]]:
    """Run every registration hook of ``plugin``; family -> records, in registration order."""
    name = pm.get_name(plugin)
    staged: dict[str, list[Any]] = {}
    for family, (hook, spec_type) in FAMILIES.items():

        def register(spec: Any, _family: str = family, _type: type = spec_type, _hook: str = hook) -> None:
            if not isinstance(spec, _type):
                raise PluginError(
                    f"plugin {name!r} passed {spec!r} to register() in {_hook}; expected a {_type.__name__}"
                )
            spec_name = getattr(spec, "name", None)  # every Spec record has one
            if not isinstance(spec_name, str) or not spec_name.strip():
                raise PluginError(f"plugin {name!r} registered a {_type.__name__} without a name: {spec!r}")
            staged.setdefault(_family, []).append(spec)

        call_for(pm, hook, plugin, register=register)
    return staged


def _check_pending(pm: pluggy.PluginManager, infos: dict[str, PluginInfo]) -> None:
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        name = pm.get_name(exc.plugin) or repr(exc.plugin)
        info = infos.get(name)
        where = f"plugin {name!r}" + (f" ({info.distribution} {info.version})" if info else "")
        unknown = [h.name for h in pm.get_hookcallers(exc.plugin) or [] if not h.has_spec()]
        known = [n for n, caller in vars(pm.hook).items() if not n.startswith("_") and caller.has_spec()]
        hints = []
        for hook in unknown:
            close = difflib.get_close_matches(hook, known, n=1)
            hints.append(f"{hook!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise PluginError(
            f"{where} implements unknown hook {', '.join(hints) or str(exc)}; "
            "fix the hook name or remove the @hookimpl marker"
        ) from exc


def _hooks_of(pm: pluggy.PluginManager, plugin: object) -> tuple[str, ...]:
    return tuple(sorted(h.name for h in pm.get_hookcallers(plugin) or []))


@define
class _Loader:
    """The mutable state of one ``load_registry()`` run."""

    pm: pluggy.PluginManager
    strict: bool
    allow: list[str] | None
    #: plugin name -> info, in load order (built-ins first).
    infos: dict[str, PluginInfo] = field(factory=dict)
    loaded: list[tuple[object, PluginInfo]] = field(factory=list)

    def add(self, info: PluginInfo, module_or_loader: Callable[[], object]) -> None:
        """Import (via ``module_or_loader()``) and register one plugin, honouring the env vars."""
        if info.name in self.infos:
            raise PluginError(
                f"two plugins are named {info.name!r}: {self.infos[info.name].distribution} and "
                f"{info.distribution}; uninstall one of them"
            )
        if self.pm.is_blocked(info.name):
            self.infos[info.name] = evolve(info, status="blocked")
            return
        if self.allow is not None and info.name not in self.allow and info.name != BUILTINS[0]:
            self.infos[info.name] = evolve(info, status="skipped")
            return
        where = f"plugin {info.name!r} from {info.distribution} {info.version}"
        try:
            module = module_or_loader()
        except Exception as exc:
            message = f"{where} failed to import: {_describe(exc)}"
            if self.strict:
                raise PluginImportError(message + " (METRALE_STRICT_PLUGINS is set)") from exc
            logger.warning("{}; it is skipped (set METRALE_STRICT_PLUGINS=1 to fail instead)", message)
            self.infos[info.name] = evolve(info, error=_describe(exc), status="failed")
            return
        try:
            self.pm.register(module, name=info.name)
        except (ValueError, pluggy.PluginValidationError) as exc:
            raise PluginError(f"{where} cannot be registered: {exc}") from exc
        self.infos[info.name] = info
        self.loaded.append((module, info))

    def collect(self, reg: Registry) -> None:
        """Run the registration hooks plugin by plugin and fill ``reg``'s families."""
        for plugin, info in self.loaded:
            try:
                staged = _collect(self.pm, plugin)
            except Exception as exc:
                message = f"plugin {info.name!r} from {info.distribution} {info.version} failed to register"
                if self.strict or isinstance(exc, PluginError):
                    raise PluginError(f"{message}: {_describe(exc)}") from exc
                logger.warning("{}: {}; it is skipped", message, _describe(exc))
                self.pm.unregister(plugin)
                self.infos[info.name] = evolve(info, error=_describe(exc), status="failed")
                continue
            for family, specs in staged.items():
                table = getattr(reg, family)
                for spec in specs:
                    if spec.name in table:
                        first = self.infos[reg.origins[family, spec.name]]
                        raise DuplicateComponent(
                            f"{singular(family)} {spec.name!r} is registered by both "
                            f"{first.distribution} (plugin {first.name!r}) and {info.distribution} "
                            f"(plugin {info.name!r}); uninstall one or disable it with "
                            f"METRALE_DISABLE_PLUGINS={info.name}"
                        )
                    table[spec.name] = spec
                    reg.origins[family, spec.name] = info.name
            components = {family: [spec.name for spec in specs] for family, specs in staged.items()}
            self.infos[info.name] = evolve(info, components=components, hooks=_hooks_of(self.pm, plugin))


def _warn_shadowed_loaders(reg: Registry) -> None:
    served: dict[str, str] = {}
    for spec in reg.model_loaders.values():
        for model_type in spec.model_types:
            if model_type in served:
                logger.warning(
                    "model_type {!r} is served by loaders {!r} and {!r}; {!r} is used",
                    model_type,
                    served[model_type],
                    spec.name,
                    served[model_type],
                )
            else:
                served[model_type] = spec.name


def load_registry(*, entry_points: Iterable[importlib.metadata.EntryPoint] | None = None) -> Registry:
    """Load the built-ins and every ``metrale`` entry point, and collect their components.

    ``entry_points`` replaces discovery (``importlib.metadata.entry_points(group="metrale")``).
    Raises :class:`PluginError` (misspelled hook, bad registration), :class:`DuplicateComponent`
    and, with ``METRALE_STRICT_PLUGINS=1``, :class:`PluginImportError`.
    """
    from metrale_core import __version__

    pm = new_plugin_manager()
    for name in _env_names("METRALE_DISABLE_PLUGINS") or []:
        pm.set_blocked(name)
    loader = _Loader(pm=pm, strict=_strict(), allow=_env_names("METRALE_PLUGINS"))
    builtin_name, builtin_module = BUILTINS
    loader.add(
        PluginInfo(builtin_name, "metrale-core", __version__),
        lambda: importlib.import_module(builtin_module),
    )
    if entry_points is None:
        entry_points = importlib.metadata.entry_points(group=GROUP)
    for ep in sorted(entry_points, key=lambda ep: ep.name):
        dist, version = (ep.dist.name, ep.dist.version) if ep.dist is not None else ("?", "?")
        loader.add(PluginInfo(ep.name, dist, version), ep.load)
    for name in loader.allow or []:
        if name not in loader.infos:
            logger.warning("METRALE_PLUGINS names {!r}, but no such plugin is installed", name)
    _check_pending(pm, loader.infos)
    reg = Registry(pm=pm)
    loader.collect(reg)
    reg.plugins = list(loader.infos.values())
    _warn_shadowed_loaders(reg)
    return reg
