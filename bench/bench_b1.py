"""Benchmark: the B1 margin observer's cost, decode tok/s with ``--b1-observer`` on vs off.

SmolLM2-135M (the embedded GGUF), greedy, ``--tokens`` per stream, widths 1 and 16, the engine
built from the installed plugin registry exactly as ``met serve`` builds it.  Two workloads:

- ``plain``: no tool call; the observer reads each row's parser state and does nothing else.
- ``in-body``: every sequence's stream parser (glm47) was fed ``<tool_call>f<arg_key>text
  </arg_key><arg_value>x`` first, so every decode position is inside a parameter body: the worst
  case, one batched top-2 scan per step over all rows (plus a count per low-margin position).

Runs alternate off/on ``--repeats`` times; the median decode rate is reported, with the time
spent inside the observer as a share of decode wall time and per decode step (less noisy than the
rate difference on a shared machine).  Greedy outputs with the observer on must equal those with it off (checked).

    python bench/bench_b1.py [--threads 2] [--tokens 48] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from bench_args import int_flags  # same folder
from loguru import logger

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
BODY_PREFIX = "<tool_call>f<arg_key>text</arg_key><arg_value>x"


class ObserverClock:
    """Accumulates the wall time spent inside ``B1MarginObserver.__call__``."""

    def __init__(self) -> None:
        from metrale_b1.b1_margin import B1MarginObserver

        self.seconds = 0.0
        original = B1MarginObserver.__call__
        clock = self

        def timed(observer, logits, ctx):
            started = time.perf_counter()
            try:
                return original(observer, logits, ctx)
            finally:
                clock.seconds += time.perf_counter() - started

        B1MarginObserver.__call__ = timed


def run(model, tok, registry, prompt_ids, width, tokens, observer, workload, clock):
    from metrale_b1.b1_margin import low_margin_count
    from metrale_core.engine import EngineConfig, LLMEngine
    from metrale_core.sampling.params import SamplingParams
    from metrale_core.streamparse import make_stream_parser

    engine = LLMEngine(
        model,
        EngineConfig(
            block_size=16, kv_cache_memory=1 << 29, max_prefill_tokens=4096, plugin_options={"b1_observer": observer}
        ),
        tokenizer=tok,
        registry=registry,
    )
    assert ("b1-margin" in engine.output_processor.pipeline.processor_names) == (observer == "on")
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    for i in range(width):
        extras = None
        if workload == "in-body":
            parser = make_stream_parser(registry, tool_parser="glm47")
            parser.feed(BODY_PREFIX)
            assert parser.inside_parameter_body and parser.param_body_chars_emitted > 0
            extras = {"stream_parser": parser}
        engine.add_request(f"r{i}", prompt_ids, params, extras=extras)
    out: dict[str, list[int]] = {}
    first, steps = None, 0
    while engine.has_unfinished():
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
        steps += 1
        if first is None:  # the prefill step sampled the first tokens
            first, steps = time.perf_counter(), 0
            clock.seconds = 0.0
    seconds = time.perf_counter() - first
    decoded = sum(len(v) for v in out.values()) - width
    return (out, decoded / seconds, clock.seconds / seconds, clock.seconds / max(steps, 1), low_margin_count(engine))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    int_flags(parser, threads=2, tokens=48, repeats=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logger.remove()
    logger.add(sys.stderr, level="ERROR")  # the drift warnings of the in-body workload are expected
    from metrale_core.loading.load import load_model
    from metrale_core.plugin.discovery import load_registry

    registry = load_registry()
    loaded = load_model(None, registry=registry, progress=False)
    model, tok = loaded.model, loaded.tokenizer
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": PROMPT}]))
    clock = ObserverClock()
    print(
        f"SmolLM2-135M Q4_1, CPU threads={args.threads}, greedy, {args.tokens} tokens/stream, median of {args.repeats}"
    )
    print(
        f"{'workload':<8} {'width':>5} {'off tok/s':>10} {'on tok/s':>9} {'cost':>7} "
        f"{'observer share':>15} {'us/step':>8} {'counted':>8}"
    )
    for workload in ("plain", "in-body"):
        for width in (1, 16):
            rates = {"off": [], "on": []}
            shares, per_step, counts = [], [], []
            reference = None
            for _ in range(args.repeats):
                for observer in ("off", "on"):
                    got, rate, share, step_s, count = run(
                        model, tok, registry, ids, width, args.tokens, observer, workload, clock
                    )
                    reference = reference or got
                    assert got == reference, "the observer changed the greedy output"
                    rates[observer].append(rate)
                    if observer == "on":
                        shares.append(share)
                        per_step.append(step_s)
                        counts.append(count)  # this run's engine's own counter
            off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
            counted = sum(counts) // args.repeats
            print(
                f"{workload:<8} {width:>5} {off:10.1f} {on:9.1f} {(off - on) / off:6.1%} "
                f"{statistics.median(shares):14.2%} {statistics.median(per_step) * 1e6:8.0f} {counted:>8}"
            )


if __name__ == "__main__":
    main()
