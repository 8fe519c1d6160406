"""One ``test_hook_<name>`` per hookspec: a plugin implementing the hook changes what the core does.

``tests/test_docs.py`` fails when a hookspec has no such test (the datasette rule).  Each test
registers a small inline plugin through the real loader (an entry point whose target is an object
in a throw-away module), so the hook runs exactly as for an installed distribution.
"""

from __future__ import annotations

import importlib.metadata
import sys
import types

import pytest
import torch

from metrale_core import hookimpl
from metrale_core.engine import EngineConfig, build_pipeline
from metrale_core.plugin import components
from metrale_core.plugin.discovery import load_registry
from metrale_core.sampling import DefaultSampler, PositionKind, SamplingParams

MODULE = "_metrale_inline_hook_plugins"


def registry_with(plugin: object, name: str = "inline"):
    """A registry holding the built-ins and ``plugin`` (registered under ``name``)."""
    module = sys.modules.setdefault(MODULE, types.ModuleType(MODULE))
    setattr(module, name, plugin)
    ep = importlib.metadata.EntryPoint(name=name, value=f"{MODULE}:{name}", group="metrale")
    return load_registry(entry_points=[ep])


class Row:
    params = SamplingParams(temperature=0.0)
    prompt_ids, output_ids, generator, extras = (1,), [], None, {}


def test_hook_metrale_model_loaders():
    class Plugin:
        @hookimpl
        def metrale_model_loaders(self, register):
            register(
                components.ModelLoaderSpec(
                    "inline-lm",
                    factory=lambda store, options: ("built", store),
                    model_types=("inline",),
                    architectures=("InlineForCausalLM",),
                )
            )

    reg = registry_with(Plugin())
    spec = reg.find_model_loader({"model_type": "other", "architectures": ["InlineForCausalLM"]})
    assert spec.name == "inline-lm" and spec.factory("store", None) == ("built", "store")
    assert reg.provider("model_loaders", "inline-lm").name == "inline"


def test_hook_metrale_kv_scale_sources():
    class Plugin:
        @hookimpl
        def metrale_kv_scale_sources(self, register):
            register(components.KVScaleSourceSpec("unit", factory=lambda *a, **k: 1.0))

    reg = registry_with(Plugin())
    assert reg.kv_scale_sources["unit"].factory() == 1.0
    assert reg.provider("kv_scale_sources", "unit").name == "inline"


def test_hook_metrale_logit_processors():
    class Ban7:
        def __call__(self, logits, ctx):
            logits[:, 7] = float("-inf")

    class Plugin:
        @hookimpl
        def metrale_logit_processors(self, register):
            register(
                components.LogitProcessorSpec("ban7", factory=lambda config: Ban7(), kinds={PositionKind.FINAL_DECODE})
            )

    pipeline = build_pipeline(EngineConfig(), registry_with(Plugin()))
    assert "ban7" in pipeline.processor_names  # beside the core's own (reasoning-budget)
    logits = torch.zeros(2, 10)
    logits[:, 7] = 5.0
    out = pipeline.sample(logits, [Row(), Row()], [PositionKind.FINAL_DECODE, PositionKind.PREFILL_LAST])
    assert out.token_ids == [0, 7]  # banned only on the kind it declared


def test_hook_metrale_samplers():
    class Last(DefaultSampler):
        def sample(self, logits, rows):
            out = super().sample(logits, rows)
            return type(out)(token_ids=[logits.shape[1] - 1] * len(rows))

    class Plugin:
        @hookimpl
        def metrale_samplers(self, register):
            register(components.SamplerSpec("last", factory=Last))

    reg = registry_with(Plugin())
    pipeline = build_pipeline(EngineConfig(sampler="last"), reg)
    assert isinstance(pipeline.sampler, Last)
    assert pipeline.sample(torch.zeros(1, 5), [Row()], [PositionKind.FINAL_DECODE]).token_ids == [4]


def test_hook_metrale_schedulers():
    from metrale_core.testing import Arrive, Scenario, run_scenario

    class Lifo:
        def __init__(self, config):
            self.config = config

        def next_waiting(self, waiting):
            return max(waiting, key=lambda seq: seq.order)

        def choose_victim(self, candidates):
            return candidates[-1]

    class Plugin:
        @hookimpl
        def metrale_schedulers(self, register):
            register(components.SchedulerSpec("lifo", factory=Lifo))

    events = [Arrive(0, f"r{k}", [k, k + 1], [40]) for k in (10, 20, 30)]
    result = run_scenario(
        Scenario("lifo", events, engine=dict(max_num_seqs=1, scheduler="lifo")), registry=registry_with(Plugin())
    )
    firsts = [call.seqs[0].key for call in result.model.calls if call.seqs[0].start == 0]
    assert firsts == [30, 20, 10]


def test_hook_metrale_executors(tmp_path):
    from metrale_core.errors import ConfigError
    from metrale_core.parallel.launch import load_parallel

    launched = []

    class NoRoom:
        def launch(self, world):
            launched.append(world)
            raise ConfigError("no room for the workers")

        def poll(self):
            return None

        def shutdown(self, timeout):
            return None

    class Plugin:
        @hookimpl
        def metrale_executors(self, register):
            register(components.ExecutorSpec("noroom", factory=NoRoom, description="never starts"))

    reg = registry_with(Plugin())
    assert set(reg.executors) >= {"noroom", "uni", "mp", "env"}
    with pytest.raises(ConfigError, match="no room"):  # before any weight is read
        load_parallel(tmp_path / "absent", registry=reg, size=2, backend="noroom", progress=False)
    assert launched == [2]


def test_hook_metrale_speculative_proposers():
    class Plugin:
        @hookimpl
        def metrale_speculative_proposers(self, register):
            register(components.ProposerSpec("echo", factory=lambda *a, **k: "echo-proposer"))

    reg = registry_with(Plugin())
    assert reg.proposers["echo"].factory() == "echo-proposer"
    assert reg.provider("proposers", "echo").name == "inline"


def test_hook_metrale_tool_call_parsers():
    from metrale_core.streamparse import ParsedDelta, make_stream_parser

    class Upper:
        def __init__(self, tools=None):
            self.inside_tool_call = self.inside_parameter_body = False
            self.param_body_chars_emitted, self.completed_calls = 0, []

        def feed(self, text):
            return [ParsedDelta(content=text.upper())]

        def finish(self):
            return []

    class Plugin:
        @hookimpl
        def metrale_tool_call_parsers(self, register):
            register(components.ToolCallParserSpec("upper", factory=Upper, model_types=("shouty",)))

    reg = registry_with(Plugin())
    for parser in (
        make_stream_parser(reg, tool_parser="upper", tools=[]),
        make_stream_parser(reg, model_type="shouty", tools=[]),
    ):
        assert [d.content for d in parser.feed("hi")] == ["HI"]


def test_hook_metrale_engine_flags():
    from metrale_core.cli.flags import engine_config_from_args
    from metrale_core.cli.main import build_parser

    class Plugin:
        @hookimpl
        def metrale_engine_flags(self, parser):
            parser.add_argument("--inline-level", type=int, default=3)

    reg = registry_with(Plugin())
    args = build_parser(reg).parse_args(["generate", "hi", "--inline-level", "9"])
    assert engine_config_from_args(args).plugin_options == {"inline_level": 9}
    default = engine_config_from_args(build_parser(reg).parse_args(["generate", "hi"]))
    assert default.plugin_options == {"inline_level": 3}


def test_hook_metrale_metrics():
    from metrale_core.server.metrics import plugin_metric_families

    class Plugin:
        @hookimpl
        def metrale_metrics(self, engine):
            return {"metrale:inline_seen_engine": 1.0 if engine == "the-engine" else 0.0}

    families = plugin_metric_families(registry_with(Plugin()), "the-engine", set())
    [family] = [f for f in families if f.name == "metrale:inline_seen_engine"]
    assert family.samples[0].value == 1.0


def test_hook_metrale_engine_started():
    from metrale_core.engine import LLMEngine
    from metrale_core.testing.recording_model import RecordingModel, SeqScript

    seen = []

    class Plugin:
        @hookimpl
        def metrale_engine_started(self, engine):
            seen.append(engine)
            engine.snapshots.add_extras_provider("inline_running", lambda: len(engine.scheduler.running))

    class Broken:
        @hookimpl
        def metrale_engine_started(self, engine):
            raise RuntimeError("boom")

    reg = registry_with(Plugin())
    reg.pm.register(Broken(), name="broken")  # raises: logged and skipped, the engine is built

    def model():
        return RecordingModel([SeqScript([5, 6], [7, 8, 9])])

    from loguru import logger

    warnings = []
    handle = logger.add(lambda m: warnings.append(m.record["message"]), level="WARNING")
    try:
        engine = LLMEngine(model(), EngineConfig(num_kv_blocks=8), registry=reg)
    finally:
        logger.remove(handle)
    assert seen == [engine]
    assert any("'broken' failed in metrale_engine_started" in w and "boom" in w for w in warnings)
    assert "inline_running" not in engine.snapshots.latest.extras  # nothing published yet
    engine.add_request("r", [5, 6], SamplingParams(temperature=0.0, max_tokens=3))
    engine.step()
    assert engine.snapshots.latest.extras["inline_running"] == 1
    LLMEngine(model(), EngineConfig(num_kv_blocks=8))  # no registry: the hook is not called
    assert seen == [engine]
