"""Test support for the server tests: a byte-level tokenizer with a ChatML template, and a
scripted model that answers chat prompts with fixed replies (tool calls included).

``ScriptedLM`` is a real ``CausalLM`` for the engine: it writes each fed token id into the paged
K cache and reads the whole history back through the block tables (so a wrong block table or a
leaked/reused block changes its answers).  For a chat prompt (one that ends with the
``<|im_start|>assistant\\n`` header) it replies with the first script whose keyword occurs in the
last user turn, one token per step, then ``<|im_end|>``; otherwise its logits are pseudo-random,
a deterministic function of the history, so seeds and temperature matter.
"""

from __future__ import annotations

import random

import torch

from metrale_core.model_api import ForwardBatch, KVLayout, ModelInfo, PagedKVCache
from metrale_core.testing.byte_tokenizer import CHATML, write_tokenizer
from metrale_core.testing.tools import weather_tool

__all__ = ["CHATML", "write_tokenizer"]  # the shared byte-level tokenizer, re-exported for the tests here

WEATHER_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
#: keyword in the last user turn -> reply (checked in order).
SCRIPTS = (
    ("<tool_response>", "It is sunny in Paris."),
    ("weather", WEATHER_CALL),
    ("ponder", "<think>\nTwo and two make four.\n</think>\n\nThe answer is 4."),
    ("capital", "The capital of France is Paris."),
    ("count", "one two three four five six seven eight nine ten"),
    ("café", "Un café crème, s'il vous plaît ☕ merci"),
)


class ScriptedLM:
    """See the module docstring.  A subclass speaks another chat format by overriding the class
    attributes (its end token, the assistant and user headers, its scripts)."""

    EOS = "<|im_end|>"
    ASSISTANT = "<|im_start|>assistant\n"
    USER = "<|im_start|>user\n"
    SCRIPTS = SCRIPTS

    def __init__(self, tokenizer, max_position: int = 4096):
        self.tokenizer = tokenizer
        self.eos = tokenizer.token_to_id(self.EOS)
        self.info = ModelInfo(
            architecture="scripted",
            vocab_size=tokenizer.vocab_size,
            max_position=max_position,
            kv=KVLayout(num_layers=1, num_kv_heads=1, head_dim=1, dtype=torch.float32),
            eos_token_ids=(self.eos,),
        )
        self.header = tokenizer.encode(self.ASSISTANT, add_special_tokens=False)
        self.user = tokenizer.encode(self.USER, add_special_tokens=False)
        #: What a template renders after the header when thinking is off (skipped by the script).
        self.no_think = tokenizer.encode("<think>\n\n</think>\n\n", add_special_tokens=False)
        self._replies: dict[tuple[int, ...], list[int] | None] = {}
        self.num_forwards = 0

    def make_state_pool(self, num_slots: int):
        return None

    def forward(self, batch: ForwardBatch, kv: PagedKVCache, state=None) -> torch.Tensor:
        self.num_forwards += 1
        k = kv.k[0]
        bs = kv.block_size
        slots = batch.slot_mapping.to(torch.long)
        k[slots // bs, slots % bs, 0, 0] = batch.input_ids.to(torch.float32)
        qs = batch.query_start.tolist()
        positions = batch.positions.tolist()
        rows = []
        for r in batch.logits_rows.tolist():
            i = next(j for j in range(batch.num_seqs) if qs[j] <= r < qs[j + 1])
            pos = torch.arange(positions[r] + 1)
            blocks = batch.block_tables[i].to(torch.long)[pos // bs]
            history = k[blocks, pos % bs, 0, 0].to(torch.long).tolist()
            rows.append(self._logits(history))
        return torch.stack(rows) if rows else torch.zeros(0, self.info.vocab_size)

    def _logits(self, history: list[int]) -> torch.Tensor:
        token = self._scripted(history)
        if token is not None:
            logits = torch.zeros(self.info.vocab_size)
            logits[token] = 100.0
            return logits
        g = torch.Generator().manual_seed(hash((tuple(history[-6:]), len(history))) & 0x7FFFFFFF)
        logits = torch.randn(self.info.vocab_size, generator=g) * 2.0
        logits[self.eos] = -5.0  # rare, so random continuations run to max_tokens
        return logits

    def _reply_start(self, history: list[int]) -> int | None:
        """Where the reply begins: after the last assistant header (and a closed think block)."""
        n = len(self.header)
        for at in range(len(history) - n, -1, -1):
            if history[at : at + n] == self.header:
                start = at + n
                if history[start : start + len(self.no_think)] == self.no_think:
                    start += len(self.no_think)
                return start
        return None

    def _tokens_in(self, text: str) -> int:
        """How many tokens ``text`` (a prefix of a decoded history) is: for ``_reply_start``
        overrides that find the reply's start in the text."""
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def _scripted(self, history: list[int]) -> int | None:
        start = self._reply_start(history)
        if start is None:
            return None
        key = tuple(history[:start])
        if key not in self._replies:
            self._replies[key] = self._reply(history[:start])
        reply = self._replies[key]
        if reply is None:
            return None
        k = len(history) - start
        return reply[k] if k < len(reply) else self.eos

    def _reply(self, prompt: list[int]) -> list[int] | None:
        text = self.tokenizer.decode(prompt, skip_special_tokens=False)
        last_user = text.rsplit(self.USER, 1)[-1]
        for keyword, reply in self.SCRIPTS:
            if keyword in last_user:
                return self.tokenizer.encode(reply, add_special_tokens=False)
        return None


#: The engine options of the shared scripted server (``conftest.start_server``).
SCRIPTED_ENGINE = {"block_size": 16, "num_kv_blocks": 512, "max_num_seqs": 32, "max_prefill_tokens": 2048}


def scripted_served(tokenizer, engine_options=None, registry=None, model_class=None, model_type="qwen3"):
    """The scripted model served (a ``ServedModel`` of ``model_type``): ``tokenizer`` is a
    ``Tokenizer`` or the directory of one (picklable, so a data-parallel replica process can build
    it too); ``model_class`` a ``ScriptedLM`` subclass to serve instead."""
    from metrale_core.engine import EngineConfig, LLMEngine
    from metrale_core.server import ServedModel
    from metrale_core.text.tokenizer import Tokenizer

    if registry is None:
        from metrale_core.plugin.discovery import load_registry

        registry = load_registry()
    if not isinstance(tokenizer, Tokenizer):
        tokenizer = Tokenizer.from_dir(tokenizer)
    engine = LLMEngine(
        (model_class or ScriptedLM)(tokenizer),
        EngineConfig(**{**SCRIPTED_ENGINE, **(engine_options or {})}),
        tokenizer=tokenizer,
        registry=registry,
    )
    return ServedModel(engine=engine, tokenizer=tokenizer, model_type=model_type)


def serve_scripted_class(start_server, tokenizer, model_class, model_type: str, name: str):
    """``model_class`` (a ``ScriptedLM`` subclass) served as ``name`` by ``start_server`` (the
    conftest fixture) with the installed plugins; returns an OpenAI client of it."""
    import openai

    from metrale_core.plugin.discovery import load_registry

    registry = load_registry()

    def load():
        return scripted_served(tokenizer, registry=registry, model_class=model_class, model_type=model_type)

    server, _host = start_server(loader=load, registry=registry, served_model_name=name)
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def answer_function_call(client, model: str, tool: dict, first, output: str):
    """Responses API: ``first``'s one function call answered with ``output``, continued through
    ``previous_response_id``; returns ``(call, follow-up response)``."""
    (call,) = [i for i in first.output if i.type == "function_call"]
    follow = client.responses.create(
        model=model,
        tools=[tool],
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": output}],
    )
    return call, follow


def answer_tool_use(aclient, model: str, tool: dict, asked: list, msg, content):
    """Messages API: the conversation ``asked`` + ``msg`` (ending in one ``tool_use``) + its
    ``tool_result`` of ``content``, sent again; returns ``(tool_use block, follow-up message)``."""
    (use,) = [b for b in msg.content if b.type == "tool_use"]
    follow = aclient.messages.create(
        model=model,
        max_tokens=128,
        tools=[tool],
        messages=[
            *asked,
            {"role": "assistant", "content": msg.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": content}]},
        ],
    )
    return use, follow


def random_text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "omega"]) for _ in range(words))


API_KEY = "sk-test-0123456789"

#: The chat-completions tool the scripted model calls, and the question that makes it call it.
TOOLS = [weather_tool("Current weather of a city")]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def wait_ready(url: str, timeout: float = 30.0) -> None:
    """Poll ``/health`` until it answers 200."""
    import time

    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if httpx.get(url + "/health").status_code == 200:
            return
        time.sleep(0.02)
    raise AssertionError(f"{url} never became healthy")


def wait_started(proc, url: str, read_log, live_timeout: float, ready_timeout: float) -> None:
    """Poll a ``met serve`` process's ``/health/live`` until it answers (failing with ``read_log()``
    if ``proc`` exits or ``live_timeout`` passes first), then :func:`wait_ready`."""
    import time

    import httpx

    deadline = time.monotonic() + live_timeout
    while True:
        try:
            httpx.get(url + "/health/live")
            break
        except httpx.HTTPError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"met serve did not start: {read_log()}") from None
            time.sleep(0.1)
    wait_ready(url, timeout=ready_timeout)


def messages_sse(base_url: str, messages: list, max_tokens: int, **body) -> str:
    """The raw SSE text of a streamed ``/v1/messages`` request for the scripted model (``body``:
    more fields, e.g. ``tools`` or ``thinking``)."""
    import httpx

    body = {"model": "scripted", "max_tokens": max_tokens, "stream": True, **body, "messages": messages}
    return httpx.post(base_url + "/v1/messages", json=body, timeout=60).text


def checkpoint_loader(path, registry, **engine):
    """A server loader for an HF checkpoint directory through the registry's model loader."""

    def load():
        from metrale_core.engine import EngineConfig, LLMEngine
        from metrale_core.plugin.components import LoadOptions
        from metrale_core.server import ServedModel
        from metrale_core.text.tokenizer import Tokenizer
        from metrale_core.weights import open_weights

        store = open_weights(path)
        model = registry.find_model_loader(store.config).factory(store, LoadOptions())
        tok = Tokenizer.from_dir(path)
        cfg = dict(block_size=4, num_kv_blocks=256, max_num_seqs=16, max_prefill_tokens=16)
        cfg.update(engine)
        return ServedModel(
            engine=LLMEngine(model, EngineConfig(**cfg), tokenizer=tok, registry=registry),
            tokenizer=tok,
            model_type="qwen3",
        )

    return load


def stream_while_stopping(server, max_tokens: int) -> list[str]:
    """Start a streamed completion on ``server``, stop the server once its first event arrives,
    and return the non-empty SSE lines the client read after that (the shutdown tests)."""
    import threading

    import httpx

    body = {"prompt": "abc", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as stream:
        lines = stream.iter_lines()
        assert next(lines).startswith("data: ")
        stopper = threading.Thread(target=server.stop)
        stopper.start()
        rest = [line for line in lines if line]
    stopper.join(30)
    return rest
