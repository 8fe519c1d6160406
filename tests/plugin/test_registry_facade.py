"""The registry's hook facade: every call goes through pluggy, one plugin at a time.

``Registry.announce_engine_started`` and ``Registry.collect_metrics`` call each plugin's
implementation through ``pm.subset_hook_caller``: a ``wrapper=True`` implementation (of a plugin
with no plain implementation) wraps every call and can change its result, pluggy's hook tracing
sees the calls, and a plugin that raises is logged by name while the others still run.
"""

from __future__ import annotations

from loguru import logger

from metrale_core import hookimpl
from metrale_core.plugin.registry import Registry


def _registry(*plugins: object) -> Registry:
    reg = Registry()
    for plugin in plugins:
        reg.pm.register(plugin, name=type(plugin).__name__)
    return reg


class _Seen:
    def __init__(self, log: list) -> None:
        self.log = log


class _Plain(_Seen):
    """A plain plugin: logs ``(NAME, engine)`` when told the engine started, answers ``VALUE``."""

    NAME: str
    VALUE: float

    @hookimpl
    def metrale_engine_started(self, engine):
        self.log.append((self.NAME, engine))

    @hookimpl
    def metrale_metrics(self, engine):
        return {f"metrale:{self.NAME}": self.VALUE}


class First(_Plain):
    NAME, VALUE = "first", 1.0


class Broken(_Seen):
    @hookimpl
    def metrale_engine_started(self, engine):
        self.log.append(("broken", engine))
        raise RuntimeError("boom")

    @hookimpl
    def metrale_metrics(self, engine):
        raise ValueError("no metrics today")


class Last(_Plain):
    NAME, VALUE = "last", 3.0


class Wrapper(_Seen):
    """A wrapper-only plugin: it sees each plugin's call and doubles every metrics answer."""

    @hookimpl(wrapper=True)
    def metrale_engine_started(self, engine):
        self.log.append(("wrap-before", engine))
        try:
            return (yield)
        finally:
            self.log.append(("wrap-after", engine))

    @hookimpl(wrapper=True)
    def metrale_metrics(self, engine):
        results = yield
        return [{k: 2 * v for k, v in r.items()} for r in results]


def _warnings(fn):
    seen: list[str] = []
    handle = logger.add(lambda m: seen.append(m.record["message"]), level="WARNING")
    try:
        result = fn()
    finally:
        logger.remove(handle)
    return result, seen


def test_one_failing_plugin_is_named_and_the_others_still_run():
    log: list = []
    reg = _registry(First(log), Broken(log), Last(log))
    _, warnings = _warnings(lambda: reg.announce_engine_started("E"))
    # pluggy's order (last registered first); the broken one does not stop the one after it
    assert log == [("last", "E"), ("broken", "E"), ("first", "E")]
    assert len(warnings) == 1
    assert "'Broken' failed in metrale_engine_started" in warnings[0] and "boom" in warnings[0]

    results, warnings = _warnings(lambda: reg.collect_metrics("E"))
    assert results == [("Last", {"metrale:last": 3.0}), ("First", {"metrale:first": 1.0})]
    assert len(warnings) == 1 and "'Broken' failed in metrale_metrics" in warnings[0]
    assert "no metrics today" in warnings[0]


def test_wrapper_implementations_wrap_every_call():
    log: list = []
    reg = _registry(First(log), Last(log), Wrapper(log))
    reg.announce_engine_started("E")
    assert log == [
        ("wrap-before", "E"),
        ("last", "E"),
        ("wrap-after", "E"),
        ("wrap-before", "E"),
        ("first", "E"),
        ("wrap-after", "E"),
    ]
    # the wrapper changes the answers the server exports
    assert reg.collect_metrics("E") == [("Last", {"metrale:last": 6.0}), ("First", {"metrale:first": 2.0})]


def test_hook_tracing_sees_the_facade_calls():
    reg = _registry(First([]), Last([]))
    calls: list[str] = []
    undo = reg.pm.add_hookcall_monitoring(
        lambda name, impls, kwargs: calls.append(name), lambda outcome, name, impls, kwargs: None
    )
    try:
        reg.announce_engine_started("E")
        reg.collect_metrics("E")
    finally:
        undo()
    assert calls == ["metrale_engine_started"] * 2 + ["metrale_metrics"] * 2


def test_a_hand_built_registry_has_an_empty_plugin_manager():
    reg = Registry()
    reg.announce_engine_started("E")  # no plugins: nothing to call, no error
    assert reg.collect_metrics("E") == []
    assert reg.pm.get_plugins() == set()
