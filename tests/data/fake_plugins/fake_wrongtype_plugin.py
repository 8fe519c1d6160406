"""Fake plugin (tests): hands a SchedulerSpec to the sampler hook's register()."""

from metrale_core import hookimpl
from metrale_core.plugin.components import SchedulerSpec


@hookimpl
def metrale_samplers(register):
    register(SchedulerSpec(name="not-a-sampler", factory=object))
