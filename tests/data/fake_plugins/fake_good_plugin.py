"""Fake plugin (tests): registers a sampler and a model loader, and adds an engine flag."""

from metrale_core import hookimpl
from metrale_core.plugin.components import ModelLoaderSpec, SamplerSpec


def _make_sampler():
    return "fake-greedy-sampler"


@hookimpl
def metrale_samplers(register):
    register(SamplerSpec(name="fake-greedy", factory=_make_sampler))


@hookimpl
def metrale_model_loaders(register):
    register(
        ModelLoaderSpec(
            name="fakelm",
            factory=lambda store, options: None,
            model_types=("fakelm",),
            architectures=("FakeLMForCausalLM", "FakeLMModel"),
        )
    )


@hookimpl
def metrale_engine_flags(parser):
    parser.add_argument("--fake-flag", type=int, default=7, help="a fake plugin's flag")
