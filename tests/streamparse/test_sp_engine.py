"""Engine integration: the output processor feeds the stream parser and fills RequestOutput.parsed.

A scripted model (the recording fake) emits a fixed token sequence; a tokenizer maps each token to
a text piece, with tags split across tokens (``"\\n</para"`` + ``"meter>"``).  A read-only logit
processor records the parser state the B1 observer would see at every sampled position.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from streamparse_helpers import collect

from metrale_core.engine import AsyncEngine, EngineConfig, FcfsPolicy, LLMEngine
from metrale_core.errors import InvalidRequest
from metrale_core.plugin.components import LogitProcessorSpec, SamplerSpec, SchedulerSpec
from metrale_core.plugin.registry import Registry as _CoreRegistry
from metrale_core.sampling import DefaultSampler, PositionKind, SamplingParams
from metrale_core.streamparse import StreamParser, make_stream_parser
from metrale_core.testing.recording_model import EOS, RecordingModel, SeqScript
from metrale_core.testing.staggered import run_all

PIECES = [
    "",
    "",
    "",
    "<think>",
    "plan",
    "</think>",
    "\n\n",
    "<tool_call>",
    "\n<function=",
    "get",
    ">\n",
    "<parameter=",
    "city",
    "Pa",
    "ris",
    "\n</para",
    "meter>\n",
    "</function>\n",
    "</tool_call>",
    "Done",
    ".",
]
TOKEN = {piece: i for i, piece in enumerate(PIECES) if i >= 3}
#: "<think>" .. "</tool_call>", the parameter's ">\n" piece again after its name.
OUTPUT = [TOKEN[p] for p in PIECES[3:13] + [">\n"] + PIECES[13:19]]
TOOLS = [{"type": "function", "function": {"name": "get", "parameters": {"properties": {"city": {"type": "string"}}}}}]


class PieceTokenizer:
    """Token ``i`` decodes to ``PIECES[i]``; prompt tokens (30+) decode to nothing."""

    eos_token_ids = (EOS,)

    def decode(self, ids, skip_special_tokens=True):
        return "".join(PIECES[i] if i < len(PIECES) else "" for i in ids)


class Registry(_CoreRegistry):
    """Just enough registry for the engine: the default sampler and FCFS, plus an observer."""

    def __init__(self, seen: list):
        super().__init__()  # a real (typed) Registry with an empty plugin manager

        def watch(config):
            def observe(logits, ctx):
                for row, kind in zip(ctx.rows, ctx.kinds):
                    parser = row.extras.get("stream_parser")
                    if isinstance(parser, StreamParser):
                        seen.append(
                            (
                                kind,
                                parser.inside_tool_call,
                                parser.inside_parameter_body,
                                parser.param_body_chars_emitted,
                                len(row.output_ids),
                            )
                        )

            return observe

        self.samplers = {"default": SamplerSpec("default", DefaultSampler)}
        self.schedulers = {"fcfs": SchedulerSpec("fcfs", FcfsPolicy)}
        self.logit_processors = {"watch": LogitProcessorSpec("watch", watch, read_only=True)}


def engine_with(scripts, seen=None):
    model = RecordingModel(scripts, vocab_size=64)
    cfg = EngineConfig(block_size=4, num_kv_blocks=64, max_num_seqs=8)
    return LLMEngine(model, cfg, tokenizer=PieceTokenizer(), registry=Registry(seen if seen is not None else []))


GREEDY = SamplingParams(temperature=0.0, max_tokens=64)


def test_parsed_deltas_and_the_state_seen_at_each_position():
    seen = []
    engine = engine_with([SeqScript([40, 41], OUTPUT), SeqScript([42], [TOKEN["Done"], TOKEN["."]])], seen)
    parser = make_stream_parser(tool_parser="qwen3_coder", reasoning="qwen3", tools=TOOLS)
    engine.add_request("tools", [40, 41], GREEDY, extras={"stream_parser": parser, "other": 1})
    engine.add_request("plain", [42], GREEDY)
    assert engine.scheduler.seqs["tools"].extras["other"] == 1
    outs = run_all(engine)

    assert all(o.parsed == () for o in outs["plain"])
    assert "".join(o.text_delta for o in outs["plain"]) == "Done."
    deltas = [d for o in outs["tools"] for d in o.parsed]
    got = collect(deltas, parser)
    assert got.reasoning == "plan" and got.content == ""
    assert got.calls == {0: ("get", '{"city": "Paris"}')} and got.tool_calls == [got.calls[0]]
    assert outs["tools"][-1].finished and outs["tools"][-1].finish_reason == "stop"
    # the header went out with the token that completed "<function=get>", before the call ended
    header_step = next(i for i, o in enumerate(outs["tools"]) if any(d.name for d in o.parsed))
    assert outs["tools"][header_step].num_output_tokens == 8  # "<tool_call>\n<function=get>\n"

    # state when sampling output position t = parser fed with the text of outputs [0, t)
    by_pos = {n_out: (call, body, chars) for kind, call, body, chars, n_out in seen}
    assert seen[0][0] is PositionKind.PREFILL_LAST and by_pos[0] == (False, False, 0)
    assert all(k is PositionKind.FINAL_DECODE for k, *_ in seen[1:])
    text_before = {t: "".join(PIECES[i] for i in OUTPUT[:t]) for t in range(len(OUTPUT) + 1)}
    assert text_before[12].endswith("<parameter=city>\nPa")
    assert by_pos[11] == (True, True, 0)  # after "<parameter=city>\n": body open, nothing yet
    assert by_pos[12] == (True, True, 2)  # "Pa"
    assert by_pos[13] == (True, True, 5)  # "Paris"
    assert by_pos[14] == (True, True, 5)  # "\n</para" held back: still in the body
    assert by_pos[15] == (True, False, 0)  # "meter>\n" closed it
    assert by_pos[17] == (False, False, 0)  # "</tool_call>": the call is over
    assert by_pos[4] == (False, False, 0)  # "<think>plan</think>\n\n": not in a call yet
    assert by_pos[5] == (True, False, 0)  # "<tool_call>" committed
    assert by_pos[2] == (False, False, 0)  # reasoning "plan" is never a body


def test_stop_string_text_is_never_fed():
    params = SamplingParams(temperature=0.0, max_tokens=64, stop=["</tool_call>"])
    engine = engine_with([SeqScript([40], OUTPUT + [TOKEN["Done"]])])
    parser = make_stream_parser(tool_parser="qwen3_coder", reasoning="qwen3", tools=TOOLS)
    engine.add_request("a", [40], params, extras={"stream_parser": parser})
    outs = run_all(engine)["a"]
    text = "".join(o.text_delta for o in outs)
    assert text.endswith("</function>\n") and "</tool_call>" not in text
    got = collect([d for o in outs for d in o.parsed], parser)
    # the call ended at the stop string, complete up to its closing tag: accepted at finish()
    assert got.tool_calls == [("get", '{"city": "Paris"}')] and got.content == ""
    assert outs[-1].finish_reason == "stop" and parser.finish() == []  # the engine finished it


class Exploding:
    def __init__(self):
        self.fed = []

    def feed(self, text):
        self.fed.append(text)
        if len(self.fed) == 2:
            raise RuntimeError("boom")
        return []

    def finish(self):
        raise AssertionError("finish() of a dropped parser must not be called")


def test_a_failing_parser_is_dropped_and_the_text_still_arrives():
    engine = engine_with(
        [SeqScript([40], [TOKEN["Done"], TOKEN["."], TOKEN["Done"]]), SeqScript([41], [TOKEN["Done"]])]
    )
    bad = Exploding()
    engine.add_request("bad", [40], GREEDY, extras={"stream_parser": bad})
    engine.add_request("good", [41], GREEDY, extras={"stream_parser": make_stream_parser()})
    outs = run_all(engine)
    assert "".join(o.text_delta for o in outs["bad"]) == "Done.Done"
    parsed = [d for o in outs["bad"] for d in o.parsed]
    assert "".join(d.content for d in parsed) == ".Done"  # from the failure on: plain content
    assert bad.fed == ["Done", "."]
    assert "".join(d.content for o in outs["good"] for d in o.parsed) == "Done"


def test_extras_must_be_a_dict():
    engine = engine_with([SeqScript([40], [TOKEN["Done"]])])
    with pytest.raises(InvalidRequest, match="extras must be a dict"):
        engine.add_request("a", [40], GREEDY, extras=[("stream_parser", None)])


def test_async_engine_passes_extras():
    engine = engine_with([SeqScript([40], OUTPUT)])
    async_engine = AsyncEngine(engine)
    async_engine.start()
    try:
        parser = make_stream_parser(tool_parser="qwen3_coder", reasoning="qwen3", tools=TOOLS)

        async def go():
            return [o async for o in async_engine.generate([40], GREEDY, extras={"stream_parser": parser})]

        outs = asyncio.run(go())
    finally:
        async_engine.shutdown()
    got = collect([d for o in outs for d in o.parsed], parser)
    assert got.reasoning == "plan" and json.loads(got.calls[0][1]) == {"city": "Paris"}
