"""Benchmark: tensor parallelism on CPU, TP=2 x 1 thread against TP=1 x 2 threads, same model.

On the embedded SmolLM2-135M (default weight format, the Q4_1 GGUF's own blocks), greedy,
``ignore_eos``, in-process (``LLMEngine`` stepped directly, so the HTTP path is not measured):

- aggregate tok/s of ``--streams`` concurrent requests (16 by default: all added at once, from the
  first step to the last token), for TP=1 with 2 torch threads and TP=2 (the ``mp`` executor, one
  worker process) with 1 thread per rank;
- for TP=2, rank 0's step time split into: the step broadcast (``Driver.broadcast_s``: the
  pickled ``ForwardBatch`` sent to the worker), the all-reduces (two per layer plus the
  embedding's; the time rank 0 waits in them, which includes waiting for the slower rank) and
  the logits gather, per decode step (mean over steps).

Not a test: run by hand; the figures depend on how busy the machine is (say so next to them).

    python bench/bench_parallel.py [--streams 16] [--max-tokens 64] [--prompt-words 40]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from bench_args import int_flags  # same folder

from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.loading.load import load_model
from metrale_core.parallel.launch import load_parallel
from metrale_core.plugin.components import LoadOptions
from metrale_core.sampling import SamplingParams

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "wizards",
    "quietly",
    "judge",
    "boxing",
    "matches",
    "near",
    "an",
    "old",
    "river",
    "bank",
    "in",
    "spring",
]


class _Timed:
    """Wraps a ``torch.distributed`` collective, summing the seconds rank 0 spends in it."""

    def __init__(self, fn):
        self.fn, self.seconds, self.calls = fn, 0.0, 0

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1


def _prompts(tokenizer, streams: int, words: int) -> list[list[int]]:
    return [tokenizer.encode(" ".join(WORDS[(i + j) % len(WORDS)] for j in range(words))) for i in range(streams)]


def _run(model, tokenizer, prompts, max_tokens: int) -> tuple[float, int, int]:
    """(seconds, generated tokens, steps) of all ``prompts`` added at once and run to the end."""
    engine = LLMEngine(model, EngineConfig(max_num_seqs=len(prompts), max_prefill_tokens=2048), tokenizer=tokenizer)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    tokens = steps = 0
    start = time.perf_counter()
    while engine.has_unfinished():
        tokens += sum(len(out.new_token_ids) for out in engine.step())
        steps += 1
    return time.perf_counter() - start, tokens, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    int_flags(parser, streams=16, max_tokens=64, prompt_words=40)
    args = parser.parse_args()

    torch.set_num_threads(2)
    single = load_model(None, LoadOptions(), progress=False)
    prompts = _prompts(single.tokenizer, args.streams, args.prompt_words)
    _run(single.model, single.tokenizer, prompts[:2], 4)  # warm-up (kernels, allocator)
    secs, tokens, _ = _run(single.model, single.tokenizer, prompts, args.max_tokens)
    print(
        f"TP=1 x 2 threads: {tokens} tokens in {secs:.2f}s = {tokens / secs:.1f} tok/s aggregate "
        f"({args.streams} streams)"
    )
    del single

    torch.set_num_threads(1)
    loaded = load_parallel(None, LoadOptions(), size=2, backend="mp", threads=1, progress=False)
    try:
        _run(loaded.model, loaded.tokenizer, prompts[:2], 4)
        timed = {name: _Timed(getattr(dist, name)) for name in ("all_reduce", "gather")}
        for name, fn in timed.items():
            setattr(dist, name, fn)
        driver = loaded.model.driver
        driver.broadcast_s = 0.0
        secs, tokens, steps = _run(loaded.model, loaded.tokenizer, prompts, args.max_tokens)
        for name, fn in timed.items():
            setattr(dist, name, fn.fn)
    finally:
        loaded.model.close()
    print(
        f"TP=2 x 1 thread:  {tokens} tokens in {secs:.2f}s = {tokens / secs:.1f} tok/s aggregate "
        f"({args.streams} streams)"
    )
    per = 1000.0 / steps
    step_ms = secs * per
    ar, ga, bc = timed["all_reduce"], timed["gather"], driver.broadcast_s
    print(
        f"TP=2 per step (mean of {steps} steps, rank 0): {step_ms:.1f} ms; broadcast {bc * per:.2f} ms, "
        f"all-reduce {ar.seconds * per:.2f} ms ({ar.calls // steps} calls), logits gather "
        f"{ga.seconds * per:.2f} ms; compute and the rest "
        f"{step_ms - (bc + ar.seconds + ga.seconds) * per:.1f} ms"
    )


if __name__ == "__main__":
    main()
