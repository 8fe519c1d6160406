"""Fake plugin (tests): registers one scheduler, then fails inside a registration hook."""

from metrale_core import hookimpl
from metrale_core.plugin.components import SchedulerSpec


@hookimpl
def metrale_schedulers(register):
    register(SchedulerSpec(name="half-registered", factory=object))
    raise RuntimeError("fake_raising_plugin lost its configuration")
