"""Benchmark: structured output's cost: decode tok/s with a JSON-Schema constraint vs without, and
grammar compile time of the test schemas.

SmolLM2-135M (the embedded GGUF), greedy, widths 1 and 16, the engine built from the installed
plugin registry exactly as ``met serve`` builds it (so the ``structured-output`` processor is in
the pipeline in both runs; the free run's rows are simply not constrained).  The constrained run
uses an array-of-objects schema with enough room that no row finishes before ``--tokens``
(``ignore_eos``-free: rows that end early are counted with the tokens they made).  Also prints the
processor's own mask time per step (STATS: the engine thread's time in the processor), less noisy
than the rate difference on a shared box.  The constrained run is measured twice, back to back
with the free run: with the mask fill overlapping the forward pass (``overlap``, the default) and
with it after the forward (``serial``).

Compile time: every schema of ``plugins/metrale-structured/tests/schemas.py`` compiled once
against the model's tokenizer (cache cleared), p50 and max.

    python bench/bench_structured.py [--threads 2] [--tokens 48] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from bench_args import int_flags  # same folder
from loguru import logger

ROOT = Path(__file__).resolve().parents[1]
PROMPT = [{"role": "user", "content": "List some people with their names and ages as JSON."}]
SCHEMA = {
    "type": "array",
    "minItems": 40,
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
}


def _engine():
    from metrale_core.engine import EngineConfig, LLMEngine
    from metrale_core.loading.embedded import default_model_path
    from metrale_core.loading.load import load_model
    from metrale_core.plugin.discovery import load_registry

    loaded = load_model(default_model_path(progress=False), progress=False)
    engine = LLMEngine(
        loaded.model,
        EngineConfig(kv_cache_memory=256 << 20, max_num_seqs=16),
        tokenizer=loaded.tokenizer,
        registry=load_registry(),
    )
    return engine, loaded.tokenizer


def _decode_rate(engine, tokenizer, width: int, tokens: int, constrained: bool) -> float:
    from metrale_core.sampling import SamplingParams, StructuredOutput

    structured = StructuredOutput("json_schema", json.dumps(SCHEMA), "response_format") if constrained else None
    prompt = tokenizer.encode_chat(PROMPT)
    params = SamplingParams(temperature=0.0, max_tokens=tokens, structured=structured)
    for i in range(width):
        engine.add_request(f"{time.monotonic_ns()}-{i}", prompt, params)
    while any(s.is_prefilling for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()  # prefill (and the first token) outside the timed decode
    made, started = 0, time.perf_counter()
    while engine.has_unfinished():
        made += sum(len(o.new_token_ids) for o in engine.step())
    return made / (time.perf_counter() - started)


def _compile_times(engine) -> list[float]:
    sys.path.insert(0, str(ROOT / "plugins" / "metrale-structured" / "tests"))
    from schemas import SCHEMAS

    compiler = engine.output_processor.pipeline.processor("structured-output").compiler
    times = []
    for schema in SCHEMAS.values():
        compiler._cache.clear()  # a cold compile each time
        started = time.perf_counter()
        compiler.matcher("json_schema", json.dumps(schema), "response_format")
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    int_flags(ap, threads=2, tokens=48, repeats=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    from metrale_structured.stats import STATS

    engine, tokenizer = _engine()
    print(
        f"structured output bench: SmolLM2-135M Q4_1, greedy, {args.tokens} tokens/stream, "
        f"{args.threads} threads, median of {args.repeats}"
    )
    processor = engine.output_processor.pipeline.processor("structured-output")
    for width in (1, 16):
        # back to back, interleaved: free, constrained with the mask fill overlapping the
        # forward pass (prepare), constrained with the fill after it
        runs = {"free": [], "overlap": [], "serial": []}
        mask = {"overlap": [0, 0.0], "serial": [0, 0.0]}
        for _ in range(args.repeats):
            for name in runs:
                processor.overlap = name == "overlap"
                steps0, mask0 = STATS.mask_steps, STATS.mask_seconds
                runs[name].append(_decode_rate(engine, tokenizer, width, args.tokens, name != "free"))
                if name in mask:
                    mask[name][0] += STATS.mask_steps - steps0
                    mask[name][1] += STATS.mask_seconds - mask0
        processor.overlap = True
        free = statistics.median(runs["free"])
        for name in ("overlap", "serial"):
            con = statistics.median(runs[name])
            steps, seconds = mask[name]
            mask_ms = 1e3 * seconds / steps if steps else 0.0
            print(
                f"width {width:2d}: free {free:7.1f} tok/s, json-schema ({name}) {con:7.1f} "
                f"tok/s, {100 * (1 - con / free):+5.1f}% slower; engine thread in the mask "
                f"{mask_ms:.2f} ms/step"
            )
    times = sorted(_compile_times(engine))
    print(f"compile ({len(times)} schemas): p50 {1e3 * statistics.median(times):.2f} ms, max {1e3 * times[-1]:.2f} ms")


if __name__ == "__main__":
    main()
