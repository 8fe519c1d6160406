"""Fake plugin (tests): registers a sampler name that fake_good_plugin also registers."""

from metrale_core import hookimpl
from metrale_core.plugin.components import SamplerSpec


@hookimpl
def metrale_samplers(register):
    register(SamplerSpec(name="fake-greedy", factory=object))
