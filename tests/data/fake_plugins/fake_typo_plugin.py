"""Fake plugin (tests): implements a misspelled hook (singular ``metrale_sampler``)."""

from metrale_core import hookimpl
from metrale_core.plugin.components import SamplerSpec


@hookimpl
def metrale_sampler(register):
    register(SamplerSpec(name="typo-sampler", factory=object))
