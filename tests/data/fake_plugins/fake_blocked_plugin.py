"""Fake plugin (tests): loads fine; tests block it and check it is never imported."""

from metrale_core import hookimpl
from metrale_core.plugin.components import SamplerSpec


@hookimpl
def metrale_samplers(register):
    register(SamplerSpec(name="blocked-sampler", factory=object))
