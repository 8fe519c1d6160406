"""End to end: real uvicorn, the official ``openai`` client, the installed plugin registry, the
embedded SmolLM2 model (hermes tool calls) and a random Qwen3 config with the real Qwen3
tokenizer.  Every constrained reply must ``json.loads`` / match / validate (``jsonschema``)."""

from __future__ import annotations

import json
import re
import threading

import jsonschema
import openai
import pytest
from schemas import SCHEMAS
from structured_testlib import chat_text, client, concurrently, qwen3_dir, smollm2_path, start

pytestmark = pytest.mark.slow

ASK = [{"role": "user", "content": "Reply with a JSON value for a small record."}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather forecast of a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 12},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                    "unit": {"type": "string", "enum": ["c", "f"]},
                },
                "required": ["city", "days"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string", "enum": ["utc", "cet"]}},
                "required": ["zone"],
            },
        },
    },
]
WEATHER = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]


@pytest.fixture(scope="module", params=["smollm2", "qwen3-random"])
def served(request, tmp_path_factory):
    if request.param == "smollm2":
        path, model_type = smollm2_path(), "llama"
    else:
        path, model_type = qwen3_dir(tmp_path_factory.mktemp("q3")), "qwen3"
    server, host = start(path, model_type=model_type)
    try:
        yield request.param, server, host, (path, model_type)
    finally:
        server.stop()


def _schema_reply(c, name: str, stream: bool, temperature: float, seed: int):
    schema = SCHEMAS[name]
    rf = {"type": "json_schema", "json_schema": {"name": name.replace("-", "_"), "schema": schema, "strict": True}}
    text, finish = chat_text(
        c,
        stream=stream,
        messages=ASK,
        max_tokens=96,
        temperature=temperature,
        seed=seed,
        response_format=rf,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    return name, text, finish


def test_every_schema_validates_streamed_and_whole_greedy_and_sampled(served):
    _, server, _host, _checkpoint = served
    c = client(server)
    jobs = [(name, stream, temp, i) for i, name in enumerate(SCHEMAS) for stream, temp in ((False, 0.0), (True, 0.9))]
    results = concurrently(lambda job: _schema_reply(c, *job), jobs)
    failures = []
    for (name, text, finish), (_, stream, temp, _) in zip(results, jobs):
        try:
            assert finish == "stop", f"finish_reason {finish!r}"
            jsonschema.validate(json.loads(text), SCHEMAS[name])
        except Exception as exc:  # collect all, report together
            failures.append(f"{name} stream={stream} t={temp}: {text!r}: {exc}")
    assert not failures, "\n".join(failures)


def test_regex_choice_gbnf_json_object_and_completions(served):
    _, server, _, _ = served
    c = client(server)
    kw = dict(messages=ASK, max_tokens=40, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    pattern = r"[A-Z][a-z]{2,5} [0-9]{1,3}"
    for stream in (False, True):
        for temp in (0.0, 1.0):
            text, _ = chat_text(
                c,
                stream=stream,
                temperature=temp,
                seed=7,
                **{**kw, "extra_body": {**kw["extra_body"], "structured_outputs": {"regex": pattern}}},
            )
            assert re.fullmatch(pattern, text), text
            text, _ = chat_text(
                c,
                stream=stream,
                temperature=temp,
                seed=8,
                **{**kw, "extra_body": {**kw["extra_body"], "structured_outputs": {"choice": ["alpha", "beta (2)"]}}},
            )
            assert text in ("alpha", "beta (2)")
            gbnf = 'root ::= "x=" [0-9] [0-9]? ";"'
            text, _ = chat_text(
                c,
                stream=stream,
                temperature=temp,
                seed=9,
                **{**kw, "extra_body": {**kw["extra_body"], "grammar": gbnf}},
            )
            assert re.fullmatch(r"x=[0-9][0-9]?;", text), text
            text, finish = chat_text(
                c,
                stream=stream,
                temperature=temp,
                seed=10,
                **{**kw, "max_tokens": 200, "response_format": {"type": "json_object"}},
            )
            if finish == "stop":
                assert isinstance(json.loads(text), dict), text
            else:  # an object that outgrows max_tokens finishes with "length", partial
                assert finish == "length" and text.startswith("{")
    # /v1/completions: response_format, llama.cpp json_schema, vLLM structured_outputs
    schema = SCHEMAS["nested"]
    for extra in (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}},
        {"json_schema": schema},
        {"structured_outputs": {"json": schema}},
    ):
        resp = c.completions.create(model="m", prompt="A user record:", max_tokens=60, temperature=0, extra_body=extra)
        jsonschema.validate(json.loads(resp.choices[0].text), schema)


def test_max_tokens_mid_object_finishes_with_length(served):
    _, server, _, _ = served
    c = client(server)
    schema = {
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 30}},
        "required": ["items"],
    }
    for stream in (False, True):
        text, finish = chat_text(
            c,
            stream=stream,
            messages=ASK,
            max_tokens=12,
            temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
        assert finish == "length" and text.startswith('{"items":[')


@pytest.mark.parametrize(
    "bad, param, words",
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
            "response_format.json_schema",
            "Invalid type: strin",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "object", "if": {"type": "object"}}},
                }
            },
            "response_format.json_schema",
            '"if"',
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/nope"}},
                }
            },
            "response_format.json_schema",
            "nope",
        ),
        ({"extra_body": {"structured_outputs": {"regex": "[unclosed"}}}, "structured_outputs.regex", "unclosed"),
        ({"extra_body": {"grammar": 'root ::= "a" missing'}}, "grammar", "missing"),
        (
            {"extra_body": {"json_schema": {"type": "object"}, "grammar": 'root ::= "a"'}},
            "grammar",
            "Cannot use both json_schema and grammar",
        ),
        ({"extra_body": {"structured_outputs": {"regex": "a", "choice": ["a"]}}}, "structured_outputs", "exactly one"),
        (
            {"extra_body": {"structured_outputs": {"structural_tag": "x"}}},
            "structured_outputs.structural_tag",
            "not supported",
        ),
        (
            {"response_format": {"type": "json_object"}, "extra_body": {"grammar": 'root ::= "a"'}},
            "grammar",
            "one output constraint",
        ),
    ],
)
def test_bad_constraints_are_400_naming_the_field(served, bad, param, words):
    _, server, _, _ = served
    c = client(server)
    with pytest.raises(openai.BadRequestError) as info:
        c.chat.completions.create(model="m", messages=ASK, max_tokens=4, **bad)
    body = info.value.body
    assert body["param"] == param and words in body["message"], body


def test_pathological_regex_compiles_or_is_refused(served):
    """A hostile regex either compiles or is refused naming its field.  Its compile is bounded by
    the parser's fuel limits (``compiler.LIMITS_KW``: lexer states and fuel count work, not
    seconds), so the bound does not depend on the machine's load and this test asserts no
    duration; a compile that escaped the limits would hang and fail on the generous client
    deadline below, never on a speed bound."""
    _, server, _, _ = served
    c = client(server).with_options(timeout=300)
    try:
        text, _ = chat_text(
            c,
            stream=False,
            messages=ASK,
            max_tokens=8,
            temperature=0,
            extra_body={"structured_outputs": {"regex": "((a{100}){100}){100}"}},
        )
        assert set(text) <= {"a"}
    except openai.BadRequestError as exc:
        assert exc.body["param"] == "structured_outputs.regex"


def _tool_reply(c, choice, parallel, stream, max_tokens=80):
    kw = dict(
        messages=WEATHER,
        tools=TOOLS,
        tool_choice=choice,
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    if parallel is not None:
        kw["parallel_tool_calls"] = parallel
    if not stream:
        resp = c.chat.completions.create(model="m", **kw)
        msg = resp.choices[0]
        return [(t.function.name, t.function.arguments) for t in msg.message.tool_calls or []], msg.finish_reason
    calls: dict[int, list] = {}
    finish = None
    for chunk in c.chat.completions.create(model="m", stream=True, **kw):
        if not chunk.choices:
            continue
        finish = chunk.choices[0].finish_reason or finish
        for d in chunk.choices[0].delta.tool_calls or []:
            entry = calls.setdefault(d.index, ["", ""])
            entry[0] += d.function.name or ""
            entry[1] += d.function.arguments or ""
    return [tuple(calls[i]) for i in sorted(calls)], finish


def _check_calls(calls, finish, only=None, exactly_one=False, may_run_on=False):
    params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    if may_run_on and finish == "length":  # parallel calls: the model may keep calling
        calls = calls[:-1]  # (the last one is cut by max_tokens)
    else:
        assert finish == "tool_calls", (calls, finish)
    assert calls, (calls, finish)
    if exactly_one:
        assert len(calls) == 1, calls
    for name, args in calls:
        assert name in params and (only is None or name == only), calls
        jsonschema.validate(json.loads(args), params[name])


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder", "glm47"])
def test_forced_tool_calls_in_each_wire_format(served, fmt):
    which, server, host, _ = served
    if which == "smollm2" and fmt != "hermes":
        pytest.skip(
            "the embedded model is served with its own (hermes) format; the other formats run on the Qwen3 config"
        )
    import attrs

    previous = host.config
    host.config = attrs.evolve(previous, tool_call_parser=fmt)  # the format the server parses
    try:
        _forced_calls(client(server))
    finally:
        host.config = previous


def _forced_calls(c):
    named = {"type": "function", "function": {"name": "get_weather"}}
    for stream in (False, True):
        calls, finish = _tool_reply(c, named, None, stream)
        _check_calls(calls, finish, only="get_weather", exactly_one=True)
        calls, finish = _tool_reply(c, "required", False, stream)
        _check_calls(calls, finish, exactly_one=True)
        calls, finish = _tool_reply(c, "required", None, stream)
        _check_calls(calls, finish, may_run_on=True)


def test_forced_required_calls_end_at_the_servers_bound(served):
    """``tool_choice="required"`` with parallel calls allowed and room for many more tokens: the
    list ends after ``max_tool_calls`` calls with ``finish_reason == "tool_calls"`` (the embedded
    model otherwise repeats its call until the context is full)."""
    import attrs

    _, server, host, _ = served
    previous = host.config
    host.config = attrs.evolve(previous, max_tool_calls=2)
    try:
        c = client(server)
        for stream in (False, True):
            calls, finish = _tool_reply(c, "required", None, stream, max_tokens=200)
            assert 1 <= len(calls) <= 2, calls
            _check_calls(calls, finish)
    finally:
        host.config = previous


def test_mixed_concurrent_streams_and_metrics(served):
    """16 concurrent streams, half constrained: every constrained reply validates, every free
    reply equals the same free request on a server without the plugin; n=2 constrained choices
    both validate; the plugin's Prometheus metrics count them."""
    import importlib.metadata

    import httpx

    from metrale_core.plugin.discovery import load_registry

    _, server, _host, checkpoint = served
    c = client(server)
    free_msgs = [[{"role": "user", "content": f"Say something about the number {i}."}] for i in range(8)]
    names = list(SCHEMAS)[:8]

    def job(i):
        if i % 2:
            return ("free", chat_text(c, stream=True, messages=free_msgs[i // 2], max_tokens=24, temperature=0)[0])
        name = names[i // 2]
        return (name, _schema_reply(c, name, True, 0.0, i)[1])

    results = concurrently(job, range(16))
    for name, text in results[0::2]:
        jsonschema.validate(json.loads(text), SCHEMAS[name])
    path, model_type = checkpoint
    eps = [ep for ep in importlib.metadata.entry_points(group="metrale") if ep.name != "structured"]
    bare, _ = start(path, model_type=model_type, registry=load_registry(entry_points=eps))
    try:
        bc = client(bare)
        alone = concurrently(
            lambda m: chat_text(bc, stream=True, messages=m, max_tokens=24, temperature=0)[0], free_msgs
        )
    finally:
        bare.stop()
    assert [text for _, text in results[1::2]] == alone
    resp = c.chat.completions.create(
        model="m",
        messages=ASK,
        max_tokens=96,
        n=2,
        temperature=1.0,
        seed=5,
        response_format={"type": "json_schema", "json_schema": {"name": "e", "schema": SCHEMAS["enum"]}},
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    for choice in resp.choices:
        jsonschema.validate(json.loads(choice.message.content), SCHEMAS["enum"])
    metrics = httpx.get(server.url + "/metrics").text
    requests = [ln for ln in metrics.splitlines() if ln.startswith("metrale:structured_requests_total ")]
    assert requests and float(requests[0].split()[1]) >= 10
    assert "metrale:structured_mask_seconds_count" in metrics
    assert "metrale:structured_compile_seconds_sum" in metrics


def test_first_constrained_request_builds_the_index_off_the_event_loop(served):
    """The llguidance tokenizer index is built by the first constrained request, on a frontend
    worker thread: the build is held (an Event) until /health has answered 200 while it was in
    progress.  Were the build on the event loop, /health could not answer and the test would fail
    by its generous timeout (no speed bound: CI is a busy machine)."""
    import asyncio

    import httpx

    _, server, host, _ = served
    proc = host.ready().engine.output_processor.pipeline.processor("structured-output")
    proc._compiler = None  # as after start: nothing built yet
    real = proc._build_compiler
    building, release = threading.Event(), threading.Event()
    seen: dict = {}

    def held(tokenizer):
        try:
            asyncio.get_running_loop()
            seen["on_event_loop"] = True
        except RuntimeError:  # no loop runs on this thread: a worker thread
            seen["on_event_loop"] = False
        building.set()
        seen["released"] = release.wait(120)
        return real(tokenizer)

    proc._build_compiler = held
    result = {}

    def send():
        result["reply"] = chat_text(
            client(server),
            stream=False,
            messages=ASK,
            max_tokens=8,
            temperature=0,
            extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
        )

    thread = threading.Thread(target=send)
    thread.start()
    try:
        assert building.wait(120), "the first constrained request never started building the index"
        health = httpx.get(server.url + "/health", timeout=60)
        assert not release.is_set() and proc._compiler is None  # /health answered mid-build
        assert health.status_code == 200
    finally:
        release.set()
        thread.join(120)
        del proc._build_compiler
    assert seen == {"on_event_loop": False, "released": True}
    assert result["reply"][0] in ("yes", "no")
    assert proc._compiler is not None
