"""The processor and compiler on a byte-level tokenizer (one token per byte: id == byte value),
no model: registration, padding, EOS, never advancing twice, verify rows, errors, the cache."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from attrs import define, field

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "server"))
from server_testlib import write_tokenizer

from metrale_core.engine.speculation import VerifyRow
from metrale_core.sampling import (
    PositionKind,
    ProcessorContext,
    SamplingParams,
    StructuredOutput,
    StructuredOutputError,
)

MODEL_VOCAB = 300  # the tokenizer has 263 ids: 263..299 are padding rows


@define
class Row:
    params: SamplingParams
    output_ids: list = field(factory=list)
    prompt_ids: tuple = (1,)
    generator: object = None
    extras: dict = field(factory=dict)
    request_id: str = "r"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from metrale_core.text.tokenizer import Tokenizer

    return Tokenizer.from_dir(write_tokenizer(tmp_path_factory.mktemp("tok")))


@pytest.fixture
def proc(tokenizer):
    from metrale_structured.processor import StructuredProcessor

    p = StructuredProcessor()
    p.bind(tokenizer, MODEL_VOCAB, tokenizer.eos_token_ids)
    return p


def row(kind: str, value: str, out=()) -> Row:
    return Row(SamplingParams(max_tokens=64, structured=StructuredOutput(kind, value, "f")), list(out))


def allowed(proc, rows, kinds=None) -> list[set[int]]:
    logits = torch.zeros(len(rows), MODEL_VOCAB)
    ctx = ProcessorContext(range(len(rows)), rows, kinds or [PositionKind.FINAL_DECODE] * len(rows))
    proc(logits, ctx)
    return [set(torch.nonzero(r > float("-inf")).flatten().tolist()) for r in logits]


def test_registered_and_handles_structured_output():
    from metrale_core.engine.config import EngineConfig
    from metrale_core.engine.engine import build_pipeline
    from metrale_core.plugin.discovery import load_registry

    registry = load_registry()
    spec = registry.logit_processors["structured-output"]
    assert spec.order == 50 and spec.kinds == frozenset(PositionKind) and not spec.read_only
    pipeline = build_pipeline(EngineConfig(), registry)
    assert pipeline.handles_structured_output
    assert not build_pipeline(EngineConfig(), None).handles_structured_output
    with pytest.raises(StructuredOutputError, match="needs a structured-output plugin"):
        build_pipeline(EngineConfig(), None).validate(row("regex", "a").params)


def test_only_grammar_tokens_padding_never_eos_exactly_when_accepting(proc, tokenizer):
    eos = set(tokenizer.eos_token_ids)
    a, b = ord("a"), ord("b")
    r = row("regex", "ab?")
    assert allowed(proc, [r]) == [{a}]  # padding 263..299 and EOS masked
    r.output_ids.append(a)
    assert allowed(proc, [r]) == [{b} | eos]  # "a" is accepted: EOS allowed
    r.output_ids.append(b)
    assert allowed(proc, [r]) == [eos]  # complete: only EOS


def test_matcher_never_advances_twice(proc):
    r = row("regex", "abc")
    r.output_ids.append(ord("a"))
    first = allowed(proc, [r])
    # the same position again (a re-run prefill after preemption, a repeated call)
    assert allowed(proc, [r], [PositionKind.PREFILL_LAST]) == first == [{ord("b")}]
    assert r.extras["structured"].consumed == 1


def test_verify_rows_mask_each_position_and_leave_the_matcher_alone(proc):
    seq = row("regex", "abcd")
    seq.output_ids.append(ord("a"))
    drafts = [ord("b"), ord("x"), ord("d")]  # "x" is grammar-invalid
    rows = [VerifyRow(seq, tuple(seq.output_ids) + tuple(drafts[:i])) for i in range(4)]
    masks = allowed(proc, rows, [PositionKind.VERIFY] * 4)
    assert masks[0] == {ord("b")} and masks[1] == {ord("c")}
    assert len(masks[2]) == MODEL_VOCAB and len(masks[3]) == MODEL_VOCAB  # past "x": unmasked
    assert allowed(proc, [seq]) == [{ord("b")}]  # drafts did not advance the matcher


def test_free_rows_are_not_wanted(proc):
    assert not proc.wants_row(Row(SamplingParams()))
    assert proc.wants_row(row("regex", "a"))


@pytest.mark.parametrize(
    "kind, value, words",
    [
        ("json_schema", json.dumps({"type": "strin"}), "Invalid type: strin"),
        ("json_schema", json.dumps({"type": "object", "if": {}}), '"if"'),
        ("regex", "[unclosed", "unclosed"),
        ("grammar", 'root ::= "a" nope', "nope"),
        ("tool_calls", json.dumps({"format": "pythonic", "tools": [{"name": "f"}]}), "pythonic"),
    ],
)
def test_bad_constraints_raise_naming_the_field(proc, kind, value, words):
    params = SamplingParams(structured=StructuredOutput(kind, value, "my.field"))
    with pytest.raises(StructuredOutputError) as info:
        proc.validate_params(params)
    assert info.value.param == "my.field" and words in str(info.value)
    assert str(info.value).startswith("my.field: ")


def test_cache_hits_give_fresh_matchers_and_the_cache_is_bounded(proc, monkeypatch):
    import metrale_structured.compiler as compiler_module
    from metrale_structured.stats import STATS

    c = proc.compiler
    hits = STATS.cache_hits
    m1 = c.matcher("regex", "ab", "f")
    m2 = c.matcher("regex", "ab", "f")
    assert m1 is not m2 and STATS.cache_hits == hits + 1
    m1.consume_token(ord("a"))
    assert m2.validate_tokens([ord("a"), ord("b")]) == 2  # m2 not advanced by m1
    monkeypatch.setattr(compiler_module, "MAX_ENTRIES", 2)
    for pattern in ("x1", "x2", "x3"):
        c.matcher("regex", pattern, "f")
    assert c.cache_info()["entries"] == 2


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder", "glm47"])
def test_tool_call_grammar_accepts_the_format_the_parser_reads(proc, fmt):
    from metrale_core.streamparse import make_stream_parser

    tools = [
        {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        }
    ]
    text = {
        "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>',
        "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n"
        "</tool_call>",
        "glm47": "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
        "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>",
    }[fmt]
    spec = json.dumps({"format": fmt, "tools": tools, "parallel": False})
    matcher = proc.compiler.matcher("tool_calls", spec, "tool_choice")
    ids = proc.compiler.tok.tokenize_str(text)
    assert matcher.validate_tokens(ids) == len(ids) and matcher.consume_tokens(ids)
    assert matcher.is_accepting()
    parser = make_stream_parser(
        tool_parser=fmt,
        tools=[{"type": "function", "function": {"name": t["name"], "parameters": t["parameters"]}} for t in tools],
    )
    pieces = parser.feed(text) + parser.finish()
    args = "".join(p.arguments for p in pieces if p.tool_call_index == 0)
    assert json.loads(args) == {"city": "Paris", "days": 3}


def test_the_grammar_starts_after_the_reasoning_section(proc, tokenizer):
    think, end = tokenizer.token_to_id("<think>"), tokenizer.token_to_id("</think>")
    spec = StructuredOutput("regex", "ab", "f", reasoning_end="</think>", reasoning_start="<think>")
    r = Row(SamplingParams(max_tokens=64, structured=spec))
    assert allowed(proc, [r]) == [{ord("a"), think}]  # answer now, or think first
    r.output_ids += [think, ord("z"), ord("<")]
    assert len(allowed(proc, [r])[0]) == MODEL_VOCAB  # thinking: unconstrained
    r.output_ids.append(end)
    assert allowed(proc, [r]) == [{ord("a")}]  # after </think>: the grammar
    started = Row(
        SamplingParams(
            max_tokens=8,
            structured=StructuredOutput("regex", "ab", "f", reasoning_end="</think>", starts_in_reasoning=True),
        )
    )
    assert len(allowed(proc, [started])[0]) == MODEL_VOCAB


def test_drafts_are_trimmed_to_the_grammar_valid_prefix(proc, tokenizer):
    seq = row("regex", "ab+c")
    a, b, c, x = (ord(ch) for ch in "abcx")
    assert proc.valid_draft_prefix(seq, (a, b, b, x, c)) == 3
    assert proc.valid_draft_prefix(seq, (x,)) == 0
    assert proc.valid_draft_prefix(seq, (a, b, c)) == 3
    assert allowed(proc, [seq]) == [{a}]  # checking drafts never advanced the matcher
    seq.output_ids += [a, b]  # committed tokens are synced first
    assert proc.valid_draft_prefix(seq, (a,)) == 0
    assert proc.valid_draft_prefix(seq, (b, c, b)) == 2
    think, end = tokenizer.token_to_id("<think>"), tokenizer.token_to_id("</think>")
    thinking = Row(
        SamplingParams(
            max_tokens=64,
            structured=StructuredOutput("regex", "ab", "f", reasoning_end="</think>", reasoning_start="<think>"),
        )
    )
    # a reasoning section is free; the grammar applies after it ends
    assert proc.valid_draft_prefix(thinking, (think, x, x, end, a, x)) == 5


def test_pipeline_draft_prefix_asks_only_processors_that_want_the_row(proc):
    from metrale_core.plugin.components import LogitProcessorSpec
    from metrale_core.sampling.pipeline import LogitPipeline
    from metrale_core.sampling.sampler import DefaultSampler

    spec = LogitProcessorSpec(name="structured-output", factory=lambda c: proc, order=50, kinds=set(PositionKind))
    pipeline = LogitPipeline([(spec, proc)], DefaultSampler())
    a, x = ord("a"), ord("x")
    assert pipeline.draft_prefix(row("regex", "a+"), (a, a, x, a)) == 2
    assert pipeline.draft_prefix(Row(SamplingParams()), (x, x)) == 2  # a free row: untouched


def test_a_prepared_mask_equals_the_computed_one_and_a_stale_one_is_not_used(proc):
    from metrale_structured.stats import STATS

    def masks(rows, prepare_at=None):
        logits = torch.zeros(len(rows), MODEL_VOCAB)
        ctx = ProcessorContext(range(len(rows)), rows, [PositionKind.FINAL_DECODE] * len(rows))
        if prepare_at is not None:
            prepare_at(ctx)
        proc(logits, ctx)
        return [set(torch.nonzero(r > float("-inf")).flatten().tolist()) for r in logits]

    proc.overlap = True
    a, b, c = ord("a"), ord("b"), ord("c")
    rows = [row("regex", "abc"), row("regex", "(ab|ac)c", [a])]
    expected = masks(rows)
    prepared = STATS.prepared_steps
    assert masks(rows, proc.prepare) == expected == [{a}, {b, c}]
    assert STATS.prepared_steps == prepared + 1

    def prepare_then_commit(ctx):  # a token committed after the fill: the mask is stale
        proc.prepare(ctx)
        rows[0].output_ids.append(a)

    assert masks(rows, prepare_then_commit) == [{b}, {b, c}]
    assert STATS.prepared_steps == prepared + 1
    assert rows[0].extras["structured"].consumed == 1  # never advanced twice


def test_tokenizer_index_built_on_first_constrained_request_only(tokenizer):
    """bind is cheap (no llguidance tokenizer: about a second and 100 MB on a 150k vocabulary);
    the first validate_params builds it once, and every later caller shares it."""
    from metrale_structured.processor import StructuredProcessor

    p = StructuredProcessor()
    p.bind(tokenizer, MODEL_VOCAB, tokenizer.eos_token_ids)
    assert p._compiler is None
    p.validate_params(SamplingParams(max_tokens=4))  # unconstrained: nothing built
    assert p._compiler is None
    p.validate_params(row("regex", "ab").params)
    built = p._compiler
    assert built is not None and p.compiler is built
    assert allowed(p, [row("regex", "ab")]) == [{ord("a")}]
    assert p.compiler is built


def test_unbound_processor_refuses_constrained_requests():
    from metrale_structured.processor import StructuredProcessor

    p = StructuredProcessor()
    with pytest.raises(StructuredOutputError, match="needs the model's tokenizer"):
        p.validate_params(row("regex", "a").params)


@pytest.mark.parametrize("max_calls", [1, 2, 3])
def test_parallel_tool_calls_end_at_max_calls(proc, max_calls):
    """A forced ``required`` list accepts up to ``max_calls`` calls; after the last one nothing but
    the end is allowed (the bound that keeps a model repeating its call from filling the context)."""
    tools = [{"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}]
    call = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    spec = json.dumps({"format": "hermes", "tools": tools, "parallel": True, "max_calls": max_calls})
    matcher = proc.compiler.matcher("tool_calls", spec, "tool_choice")
    tok = proc.compiler.tok
    for i in range(max_calls):
        ids = tok.tokenize_str(("\n" if i else "") + call)
        assert matcher.validate_tokens(ids) == len(ids) and matcher.consume_tokens(ids), i
        assert matcher.is_accepting()
    more = tok.tokenize_str("\n" + call)
    assert matcher.validate_tokens(more) < len(more)  # no further call may start
    unbounded = proc.compiler.matcher("tool_calls", json.dumps({**json.loads(spec), "max_calls": 0}), "tool_choice")
    ids = tok.tokenize_str("\n".join([call] * (max_calls + 1)))
    assert unbounded.validate_tokens(ids) == len(ids)
