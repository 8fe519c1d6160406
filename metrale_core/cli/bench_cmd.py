"""``met bench serve`` (load against a running server) and ``met bench engine`` (in-process pp/tg).

Owner: the CLI (``metrale_core.cli.main`` calls :func:`add_parser`).  The work is done in
``metrale_core.bench``: :mod:`~metrale_core.bench.serve` (the load generator),
:mod:`~metrale_core.bench.engine` (the pp/tg tests), :mod:`~metrale_core.bench.report` (tables
and JSON).

Invariants:
- stdout carries only the result (the table, or the JSON with ``met bench engine -o json``); the
  progress bar, loading progress and logs go to stderr.
- ``met bench engine`` takes exactly ``met serve``'s engine flags (:func:`add_engine_flags`);
  its model is the positional ``MODEL``, else ``--model``, else the embedded default.
- A bad option or an unreachable server is one ``met: error:`` line, exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from metrale_core.cli.flags import add_engine_flags, engine_config_from_args, load_engine_model, positive_int

__all__ = ["add_parser", "int_list"]


def int_list(text: str) -> list[int]:
    """``"1,16"`` -> ``[1, 16]`` (positive integers, comma-separated)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma list of integers: {text!r} (try 1,16)") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"needs positive integers: {text!r}")
    return values


def add_parser(sub, registry) -> None:
    bench = sub.add_parser(
        "bench",
        help="benchmark a running server (serve) or the engine in this process (engine)",
        description="Benchmarks: 'met bench serve' loads a running OpenAI-compatible server (met serve, "
        "llama-server, vLLM); 'met bench engine' times prefill and decode in-process, like llama-bench.",
    )
    actions = bench.add_subparsers(dest="bench_command", metavar="WHAT")
    bench.set_defaults(func=lambda args, registry: _help(bench))
    _add_serve(actions)
    _add_engine(actions, registry)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _add_serve(actions) -> None:
    cmd = actions.add_parser(
        "serve",
        help="TTFT, ITL, TPOT, E2E and throughput of a running server at each concurrency",
        description="Stream --num-prompts requests per concurrency level to a running server (at most "
        "CONCURRENCY in flight, ignore_eos, greedy) and print TTFT / TPOT / ITL / E2E mean and percentiles "
        "and throughput, one row per level.",
    )
    cmd.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default: http://127.0.0.1:8000)")
    cmd.add_argument("--model", default=None, help="model name (default: the first of /v1/models)")
    cmd.add_argument(
        "--concurrency", type=int_list, default=[1], metavar="N[,N...]", help="levels, e.g. 1,16 (default: 1)"
    )
    cmd.add_argument("--prompt-tokens", type=positive_int, default=500, help="prompt length (default: 500)")
    cmd.add_argument("--output-tokens", type=positive_int, default=128, help="tokens per answer (default: 128)")
    cmd.add_argument(
        "--num-prompts", type=positive_int, default=None, help="requests per level (default: max(4, 2 x concurrency))"
    )
    cmd.add_argument(
        "--endpoint", choices=("completions", "chat"), default="completions", help="/v1/completions (default) or chat"
    )
    cmd.add_argument(
        "--api-key", default=os.environ.get("METRALE_API_KEY"), help="bearer key (default: $METRALE_API_KEY)"
    )
    cmd.add_argument("--seed", type=int, default=0, help="seed of the random prompts (default: 0)")
    cmd.add_argument(
        "--warmup",
        type=int,
        default=None,
        metavar="N",
        help="untimed short requests first (default: the highest concurrency; 0: none)",
    )
    cmd.add_argument(
        "--request-timeout", type=float, default=600.0, metavar="S", help="a request's limit (default: 600)"
    )
    cmd.add_argument("--result-file", default=None, metavar="PATH", help="also write the full result as JSON")
    cmd.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    cmd.set_defaults(func=_run_serve)


def _run_serve(args, registry) -> int:
    from metrale_core.bench.report import machine_info, serve_table, write_json
    from metrale_core.bench.serve import ServeBenchConfig, run_serve_bench

    config = ServeBenchConfig(
        url=args.url,
        concurrency=args.concurrency,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        num_prompts=args.num_prompts,
        model=args.model,
        endpoint=args.endpoint,
        api_key=args.api_key,
        seed=args.seed,
        warmup=args.warmup,
        request_timeout=args.request_timeout,
        progress=not args.no_progress,
    )
    result = run_serve_bench(config)
    result["machine"] = machine_info()
    print(serve_table(result), flush=True)
    if args.result_file:
        write_json(args.result_file, result)
    return 0


def _add_engine(actions, registry) -> None:
    cmd = actions.add_parser(
        "engine",
        help="prefill and decode tokens/s of the engine in this process (like llama-bench)",
        description="Time prefill (ppP: one P-token prompt) and decode (tgN: N tokens, greedy, ignore_eos; "
        "tgN@bB: B sequences at once) in this process with met serve's engine flags; a llama-bench-like table.",
    )
    cmd.add_argument("model_path", nargs="?", default=None, metavar="MODEL", help="as --model (default: embedded)")
    cmd.add_argument("-p", "--n-prompt", type=int, default=512, help="prefill test length, 0: none (default: 512)")
    cmd.add_argument("-n", "--n-gen", type=int, default=128, help="decode test length, 0: none (default: 128)")
    cmd.add_argument("-r", "--repetitions", type=positive_int, default=3, help="timed runs per test (default: 3)")
    cmd.add_argument("--batch", type=int_list, default=[1], metavar="B[,B...]", help="decode batch sizes (default: 1)")
    cmd.add_argument("--seed", type=int, default=0, help="seed of the random prompts (default: 0)")
    cmd.add_argument(
        "-o", "--output", choices=("table", "json"), default="table", help="stdout format (default: table)"
    )
    cmd.add_argument("--result-file", default=None, metavar="PATH", help="also write the result as JSON")
    add_engine_flags(cmd, registry)
    cmd.set_defaults(func=_run_engine)


def _run_engine(args, registry) -> int:
    model = args.model_path or args.model
    loaded = load_engine_model(args, registry, model)
    driver = getattr(loaded.model, "driver", None)  # a tensor-parallel job to stop at the end
    try:
        result = _engine_result(args, registry, loaded)
    finally:
        if driver is not None:
            driver.close()
    from metrale_core.bench.report import engine_table, to_json, write_json

    print(to_json(result) if args.output == "json" else engine_table(result), flush=True)
    if args.result_file:
        write_json(args.result_file, result)
    return 0


def _engine_result(args, registry, loaded) -> dict[str, Any]:
    import torch

    from metrale_core.bench.engine import DECODE_PROMPT_TOKENS, EngineBench
    from metrale_core.bench.report import machine_info
    from metrale_core.engine import LLMEngine

    config = engine_config_from_args(args)
    engine = LLMEngine(loaded.model, config, tokenizer=loaded.tokenizer, registry=registry)
    tests = EngineBench(engine, loaded.tokenizer, args.seed).run(
        args.n_prompt, args.n_gen, args.batch, args.repetitions
    )
    weight_format = args.weight_format or os.environ.get("METRALE_WEIGHT_FORMAT") or "auto"
    return {
        "model": loaded.path.name,
        "path": str(loaded.path),
        "loader": loaded.loader_name,
        "format": f"{weight_format}/{args.dtype}",
        "threads": torch.get_num_threads(),
        "prompt_tokens": args.n_prompt,
        "gen_tokens": args.n_gen,
        "batches": args.batch,
        "reps": args.repetitions,
        "decode_prompt_tokens": DECODE_PROMPT_TOKENS,
        "engine": {
            "max_num_seqs": config.max_num_seqs,
            "max_prefill_tokens": config.max_prefill_tokens,
            "block_size": config.block_size,
            "kv_cache_memory": config.kv_cache_memory,
            "max_model_len": engine.max_model_len,
            "tensor_parallel_size": args.tensor_parallel_size,
        },
        "machine": machine_info(),
        "tests": tests,
    }
