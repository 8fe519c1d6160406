"""The component registry: what each loaded plugin provides, and lookups over it.

Owner: built and filled by ``metrale_core.plugin.discovery.load_registry()``; read by the engine, the CLI
(``met plugins``) and the server. Core code selects components here and calls the non-registration
hooks only through the typed facade below (:meth:`Registry.announce_engine_started`,
:meth:`Registry.collect_metrics`, :meth:`Registry.add_engine_flags`), never ``pm.hook`` directly.

Invariants:
- One dict per family (``Registry.<family>``: name -> ``*Spec`` record from
  ``metrale_core.plugin.components``); a name is unique within its family across all distributions.
- ``origins[(family, name)]`` names the plugin that registered each component, and that plugin
  is in ``plugins``.
- Every hook call goes through pluggy (``pm.hook`` / ``pm.subset_hook_caller``), so
  ``wrapper=True`` implementations and hook tracing see it.  The facade calls each plugin's
  implementation on its own (wrapper-only plugins wrap every one of those calls), in pluggy's
  order (last registered first), so one that raises is attributed to its plugin, logged and
  skipped while the others still run.
- Importing this module imports no torch (``met --help`` / ``met plugins`` stay fast).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pluggy
from attrs import define, field, frozen
from loguru import logger

from metrale_core.errors import ConfigError, PluginError, UnknownArchitecture
from metrale_core.plugin import components as c

__all__ = ["FAMILIES", "PluginInfo", "Registry", "call_for", "new_plugin_manager", "singular"]

#: The pluggy project name of every Metrale plugin manager.
GROUP = "metrale"

#: family (``Registry`` attribute) -> (registration hook, record type).
FAMILIES: dict[str, tuple[str, type]] = {
    "model_loaders": ("metrale_model_loaders", c.ModelLoaderSpec),
    "kv_scale_sources": ("metrale_kv_scale_sources", c.KVScaleSourceSpec),
    "logit_processors": ("metrale_logit_processors", c.LogitProcessorSpec),
    "samplers": ("metrale_samplers", c.SamplerSpec),
    "schedulers": ("metrale_schedulers", c.SchedulerSpec),
    "proposers": ("metrale_speculative_proposers", c.ProposerSpec),
    "tool_call_parsers": ("metrale_tool_call_parsers", c.ToolCallParserSpec),
    "executors": ("metrale_executors", c.ExecutorSpec),
}


@frozen
class PluginInfo:
    """One plugin as ``met plugins`` shows it."""

    name: str
    distribution: str
    version: str
    #: family -> names it registered (only families it registered something in).
    components: dict[str, list[str]] = field(factory=dict)
    #: Why the plugin contributes nothing ("ModuleNotFoundError: ..."), or None.
    error: str | None = None
    #: "loaded", "failed", "blocked" (METRALE_DISABLE_PLUGINS) or "skipped" (not in METRALE_PLUGINS).
    status: str = "loaded"
    #: Hooks the plugin implements.
    hooks: tuple[str, ...] = ()


def new_plugin_manager() -> pluggy.PluginManager:
    """A ``pluggy.PluginManager("metrale")`` with the hookspecs added and nothing registered."""
    from metrale_core.plugin import hookspecs

    pm = pluggy.PluginManager(GROUP)
    pm.add_hookspecs(hookspecs)
    return pm


@define
class Registry:
    """The components every loaded plugin registered, per family (name -> Spec).

    Built by ``load_registry()``; a test may build one by hand from the families it needs
    (``Registry(samplers=..., schedulers=...)``), which gets an empty plugin manager.
    """

    pm: pluggy.PluginManager = field(factory=new_plugin_manager)
    plugins: list[PluginInfo] = field(factory=list)
    model_loaders: dict[str, c.ModelLoaderSpec] = field(factory=dict)
    kv_scale_sources: dict[str, c.KVScaleSourceSpec] = field(factory=dict)
    logit_processors: dict[str, c.LogitProcessorSpec] = field(factory=dict)
    samplers: dict[str, c.SamplerSpec] = field(factory=dict)
    schedulers: dict[str, c.SchedulerSpec] = field(factory=dict)
    proposers: dict[str, c.ProposerSpec] = field(factory=dict)
    tool_call_parsers: dict[str, c.ToolCallParserSpec] = field(factory=dict)
    executors: dict[str, c.ExecutorSpec] = field(factory=dict)
    #: (family, name) -> name of the plugin that registered it.
    origins: dict[tuple[str, str], str] = field(factory=dict)

    def provider(self, family: str, name: str) -> PluginInfo:
        """The plugin that registered the ``family`` component ``name``."""
        plugin = self.origins[family, name]
        return next(info for info in self.plugins if info.name == plugin)

    def get(self, family: str, name: str) -> Any:
        """The ``family`` component called ``name``; :class:`ConfigError` listing the choices."""
        table = getattr(self, family)
        if name not in table:
            choices = ", ".join(f"{n} ({self.provider(family, n).distribution})" for n in table)
            raise ConfigError(f"unknown {singular(family)} {name!r}; installed: {choices or 'none'}")
        return table[name]

    def find_model_loader(
        self, config: dict, *, gguf_architectures: Mapping[str, str] | None = None
    ) -> c.ModelLoaderSpec:
        """The loader serving ``config["model_type"]``, else any of ``config["architectures"]``.

        None serving it: :class:`UnknownArchitecture` (a ``ConfigError``), one line listing what the
        installed loaders serve.  ``gguf_architectures`` -- given for a GGUF's config: every
        ``general.architecture`` the GGUF store maps -> its HF ``architectures`` entry -- makes that
        line list the GGUF architectures an installed loader serves.
        """
        model_type = config.get("model_type")
        spec = self._serving(model_type, list(config.get("architectures") or []))
        if spec is not None:
            return spec
        hint = "install a plugin that serves it, or check METRALE_PLUGINS / METRALE_DISABLE_PLUGINS"
        if gguf_architectures is not None:
            served = [g for g, hf in gguf_architectures.items() if self._serving(g, [hf]) is not None]
            raise UnknownArchitecture(
                f"GGUF architecture {model_type!r} is not supported; supported GGUF architectures: "
                f"{', '.join(sorted(served)) or 'none'} ({hint})"
            )
        loaders = self.model_loaders.values()
        archs = sorted({a for spec in loaders for a in spec.architectures})
        types = sorted({t for spec in loaders for t in spec.model_types})
        raise UnknownArchitecture(
            f"model_type {model_type!r} (architectures: {', '.join(config.get('architectures') or []) or 'none'}) "
            f"is not supported; supported architectures: {', '.join(archs) or 'none'}; "
            f"model types: {', '.join(types) or 'none'} ({hint})"
        )

    def _serving(self, model_type: Any, architectures: list[str]) -> c.ModelLoaderSpec | None:
        """The loader whose ``model_types`` hold ``model_type``, else the first serving one of
        ``architectures`` (in their order); None when none does."""
        for spec in self.model_loaders.values():
            if model_type is not None and model_type in spec.model_types:
                return spec
        for arch in architectures:
            for spec in self.model_loaders.values():
                if arch in spec.architectures:
                    return spec
        return None

    # --- the hook facade ---------------------------------------------------------------------
    def announce_engine_started(self, engine: Any) -> None:
        """``metrale_engine_started(engine)`` on every plugin (one that raises is skipped)."""
        for _ in self._call_each("metrale_engine_started", "and is skipped", engine=engine):
            pass

    def collect_metrics(self, engine: Any) -> list[tuple[str, Any]]:
        """``(plugin name, answer)`` of every plugin's ``metrale_metrics(engine)`` that answered
        something other than None (one that raises is skipped for this call)."""
        return [
            (name, result)
            for name, result in self._call_each("metrale_metrics", "", engine=engine)
            if result is not None
        ]

    def _call_each(self, hook: str, skipped: str, **kwargs: Any) -> Iterator[tuple[str, Any]]:
        """Call ``hook`` plugin by plugin through pluggy; yields ``(plugin name, result)``.

        For each plugin with a plain implementation (in pluggy's call order), a subset caller
        without the other plain implementers runs it, so wrappers of wrapper-only plugins wrap
        each call.  An exception is logged as a warning naming the plugin and the hook.
        """
        caller = getattr(self.pm.hook, hook)
        impls = list(reversed(caller.get_hookimpls()))
        plain = [impl.plugin for impl in impls if not (impl.wrapper or impl.hookwrapper)]
        order = list(dict.fromkeys(plain))  # each plugin once, in call order
        for plugin in order:
            name = self.pm.get_name(plugin) or repr(plugin)
            others = [p for p in order if p is not plugin]
            try:
                results = self.pm.subset_hook_caller(hook, remove_plugins=others)(**kwargs)
            except Exception as exc:
                logger.warning(
                    "plugin {!r} failed in {}{}: {}: {}",
                    name,
                    hook,
                    f" {skipped}" if skipped else "",
                    type(exc).__name__,
                    exc,
                )
                continue
            for result in results:
                yield name, result

    def add_engine_flags(self, parser: Any) -> None:
        """Let every plugin add its flags to ``parser`` (the CLI's engine option group), in load order."""
        for name in [info.name for info in self.plugins if info.status == "loaded"]:
            plugin = self.pm.get_plugin(name)
            try:
                call_for(self.pm, "metrale_engine_flags", plugin, parser=parser)
            except Exception as exc:
                raise PluginError(f"plugin {name!r} failed to add its engine flags: {exc}") from exc


def call_for(pm: pluggy.PluginManager, hook: str, plugin: object, **kwargs: Any) -> None:
    """Call ``hook`` on ``plugin``'s implementation only (nothing if it has none)."""
    if not any(impl.plugin is plugin for impl in getattr(pm.hook, hook).get_hookimpls()):
        return
    others = [p for p in pm.get_plugins() if p is not plugin]
    pm.subset_hook_caller(hook, remove_plugins=others)(**kwargs)


def singular(family: str) -> str:
    return family[:-1].replace("_", " ")
