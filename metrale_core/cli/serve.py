"""``met serve [MODEL]``: the OpenAI-compatible HTTP server (Litestar on uvicorn).

Owner: the CLI.  Binds, starts listening at once and loads the model on a worker thread
(``/health`` is 503 until it is ready), so orchestrators see the process come up immediately.

Invariants:
- Binds 127.0.0.1 unless ``--host`` says otherwise; the API key comes from ``--api-key`` or
  ``METRALE_API_KEY`` and is never logged.
- The engine flags are the shared ones (``metrale_core.cli.flags``), plugins' included.
- Access logs (one line per request) go to stderr through loguru even at the default log level.
- ``--data-parallel-size N`` (N > 1) serves through ``metrale_core.dataparallel.ReplicaPool``:
  each replica process rebuilds the engine from the same flags (:func:`replica_served`); see
  :func:`serving_loader`.  With ``--data-parallel-size-local L`` < N the other N - L replicas
  are remote (``met replica --connect`` at ``--data-parallel-address``, key from
  ``$METRALE_REPLICA_KEY``).  Data and tensor parallelism are not combined yet (a clear error).
- With ``--tensor-parallel-size`` > 1 the workers are stopped when the server stops (Ctrl-C,
  SIGTERM).  A lost worker (or its host) fails the requests in flight and the server stays up,
  answering 503 ``engine_failed`` with the reason (``ServedModel.fault``) on ``/health`` and new
  requests; stopped afterwards, it exits 1 with the reason on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

from metrale_core.cli.flags import (
    add_engine_flags,
    add_size_flag,
    engine_config_from_args,
    load_engine_model,
    positive_int,
)
from metrale_core.errors import ConfigError

__all__ = ["add_parser", "build_loader", "replica_served", "run", "served_name", "serving_loader"]

DEFAULT_NAME = "SmolLM2-135M-Instruct"


def add_parser(sub, registry) -> argparse.ArgumentParser:
    cmd = sub.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve MODEL (an HF checkpoint directory or a .gguf file; default: the "
        "embedded SmolLM2-135M-Instruct) at /v1/chat/completions, /v1/completions, "
        "/v1/models, plus /health, /metrics, /tokenize and /detokenize.",
    )
    cmd.add_argument(
        "model_arg",
        nargs="?",
        metavar="MODEL",
        default=None,
        help="checkpoint directory or .gguf file (same as --model)",
    )
    http = cmd.add_argument_group("server")
    http.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    http.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    http.add_argument(
        "--served-model-name",
        default=None,
        metavar="NAME",
        help="the model name clients send (default: the checkpoint's name)",
    )
    http.add_argument(
        "--api-key",
        default=os.environ.get("METRALE_API_KEY"),
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on the API routes (default: $METRALE_API_KEY; unset: no auth)",
    )
    add_size_flag(http, "--max-body-bytes", "32M", "largest request body")
    http.add_argument(
        "--max-waiting",
        type=int,
        default=256,
        metavar="N",
        help="requests that may wait beyond --max-num-seqs running ones before new ones get 503 (default: 256)",
    )
    http.add_argument(
        "--tool-call-parser",
        default=None,
        metavar="NAME",
        help="tool-call format (hermes, qwen3_coder, glm47, ...; default: by model type, else hermes)",
    )
    http.add_argument(
        "--reasoning-parser",
        default=None,
        metavar="NAME",
        help="split <think> reasoning into reasoning_content (qwen3, think, "
        "deepseek_r1, glm45, granite, harmony, none; default: by chat template / model type)",
    )
    http.add_argument(
        "--pooling",
        default=None,
        choices=("mean", "last"),
        help="/v1/embeddings pooling over the last hidden state (default: the model's declared pooling, else mean)",
    )
    http.add_argument(
        "--responses-store-size",
        type=int,
        default=1024,
        metavar="N",
        help="responses kept in memory for previous_response_id and "
        "GET /v1/responses/{id} (LRU; 0 stores none; default: 1024)",
    )
    http.add_argument(
        "--stream-interval-ms",
        type=float,
        default=20.0,
        metavar="MS",
        help="a stream's tokens are sent at most this often, merged (the first and last at once); "
        "fewer wake-ups and writes leave the cores to the model; 0 sends every step (default: 20)",
    )
    http.add_argument(
        "--max-tool-calls",
        type=positive_int,
        default=8,
        metavar="N",
        help="most calls one forced tool_choice=required turn may make, when parallel_tool_calls is not "
        "false (the grammar ends the list there; default: 8)",
    )
    http.add_argument(
        "--shutdown-grace",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="time in-flight requests get to finish on shutdown (default: 10)",
    )
    http.add_argument(
        "--data-parallel-size",
        type=int,
        default=1,
        metavar="N",
        help="serve with N engine replicas, each its own process, requests routed "
        "by load with prefix affinity; --threads is then per replica (default: "
        "the cores split between them) (default: 1, one in-process engine)",
    )
    http.add_argument(
        "--data-parallel-size-local",
        type=int,
        default=None,
        metavar="L",
        help="of the --data-parallel-size replicas, run L on this machine; the others are remote "
        "('met replica --connect HOST:PORT' on other hosts, same $METRALE_REPLICA_KEY) (default: all)",
    )
    http.add_argument(
        "--data-parallel-address",
        default=None,
        metavar="HOST:PORT",
        help="where remote data-parallel replicas connect (needed when --data-parallel-size-local is "
        "below --data-parallel-size)",
    )
    http.add_argument(
        "--no-tui",
        action="store_true",
        help="plain logs instead of the terminal dashboard (also METRALE_NO_TUI=1; "
        "automatic when stdout is not a terminal or TERM is dumb)",
    )
    add_engine_flags(cmd, registry)
    cmd.set_defaults(func=run)
    return cmd


def _model_path(args) -> str | None:
    if args.model_arg and args.model and args.model_arg != args.model:
        raise ConfigError(f"two models given: {args.model_arg!r} and --model {args.model!r}")
    return args.model_arg or args.model


def served_name(model: str | None) -> str:
    """The default ``model`` name clients use: the checkpoint's file or directory name, or a hub
    name's repo id ``ORG/NAME`` as vLLM does."""
    from metrale_core.hub import is_hub_name, parse_spec

    if model is None:
        return DEFAULT_NAME
    if is_hub_name(model):
        return parse_spec(model).repo_id
    path = Path(model).expanduser()
    return path.stem if path.suffix == ".gguf" else (path.resolve().name or str(model))


def build_loader(args, registry, model: str | None, on_tensor=None, jobs: list | None = None):
    """The loader the server runs on a worker thread: weights, tokenizer, engine.  A
    tensor-parallel job's ``Driver`` is appended to ``jobs`` (``run`` stops it at exit)."""

    def load():
        from metrale_core.engine import LLMEngine
        from metrale_core.server import ServedModel

        loaded = load_engine_model(args, registry, model, progress=False, on_tensor=on_tensor)
        driver = getattr(loaded.model, "driver", None)
        if driver is not None and jobs is not None:
            jobs.append(driver)
        engine = LLMEngine(loaded.model, engine_config_from_args(args), tokenizer=loaded.tokenizer, registry=registry)
        return ServedModel(
            engine=engine,
            tokenizer=loaded.tokenizer,
            model_type=loaded.store.config.get("model_type"),
            fault=(lambda: driver.failed) if driver is not None else None,
        )

    return load


def replica_served(options: dict, model: str | None):
    """In a data-parallel replica process: the served model the flags in ``options`` describe
    (plugins loaded afresh, since a registry does not cross processes)."""
    from metrale_core.plugin.discovery import load_registry

    return build_loader(argparse.Namespace(**options), load_registry(), model)()


#: The server's own KV pool under data parallel: its engine only validates requests, never runs.
FRONT_KV_MEMORY = 16 << 20


def serving_loader(args, registry, model: str | None, on_tensor=None, jobs: list | None = None):
    """:func:`build_loader`'s loader; under ``--data-parallel-size N`` (N > 1) its served model
    runs N replica processes (``metrale_core.dataparallel.ReplicaPool``), each building the
    engine from the same flags, and the server's own engine (for validation and the model's
    facts) gets a token KV pool."""
    size = args.data_parallel_size
    if size < 1:
        raise ConfigError(f"--data-parallel-size must be >= 1, got {size}")
    if size == 1 and getattr(args, "data_parallel_size_local", None) in (None, 1):
        return build_loader(args, registry, model, on_tensor=on_tensor, jobs=jobs)
    if (getattr(args, "tensor_parallel_size", 1) or 1) > 1:
        raise ConfigError(
            "--data-parallel-size with --tensor-parallel-size > 1 is not supported yet; use one of the two"
        )
    import functools
    import pickle

    import attrs

    from metrale_core.dataparallel import ReplicaPool

    threads = args.threads or max(1, (os.cpu_count() or 1) // size)
    options = {k: v for k, v in vars(args).items() if k != "func"}
    options["threads"] = threads
    factory = functools.partial(replica_served, options, model)
    try:
        pickle.dumps(factory)
    except Exception as exc:  # a plugin flag value that cannot cross processes
        raise ConfigError(
            f"--data-parallel-size: the flags cannot be sent to replica processes ({type(exc).__name__}: {exc})"
        ) from None
    front = functools.partial(ReplicaPool, factory=factory, size=size, threads=threads, **_remote_replicas(args))
    loader = build_loader(
        argparse.Namespace(**{**options, "kv_cache_memory": FRONT_KV_MEMORY}), registry, model, on_tensor=on_tensor
    )

    def load():
        return attrs.evolve(loader(), async_front=front)

    return load


def _remote_replicas(args) -> dict:
    """``ReplicaPool``'s remote-replica options from ``--data-parallel-size-local`` /
    ``--data-parallel-address`` (empty when every replica is local)."""
    size = args.data_parallel_size
    local = getattr(args, "data_parallel_size_local", None)
    local = size if local is None else local
    if not 0 <= local <= size:
        raise ConfigError(f"--data-parallel-size-local must be in 0..{size} (--data-parallel-size), got {local}")
    if local == size:
        return {}
    from metrale_core.dataparallel.remote import parse_address, replica_key
    from metrale_core.parallel.distributed import DEFAULT_TIMEOUT_S

    if not getattr(args, "data_parallel_address", None):
        raise ConfigError(
            f"{size - local} remote replica(s) need --data-parallel-address HOST:PORT (where they connect)"
        )
    return {
        "remote": size - local,
        "address": parse_address(args.data_parallel_address),
        "authkey": replica_key(),
        "link_timeout_s": getattr(args, "distributed_timeout", None) or DEFAULT_TIMEOUT_S,
    }


class _Terminated(Exception):
    """SIGTERM, re-raised by uvicorn after its graceful shutdown (see :func:`_serving`)."""


def _raise_terminated(signum, frame) -> None:
    raise _Terminated


def _serving(args, jobs: list, serve) -> int:
    """Run ``serve()``; afterwards stop the tensor-parallel jobs in ``jobs``.

    uvicorn re-raises SIGTERM once it has shut down gracefully; with tensor parallelism that
    signal raises :class:`_Terminated` here instead of killing the process, so the workers are
    told to stop (exit code 143 as before); a failed job exits 1 with its reason on stderr.

    Once the jobs are stopped and the group left, a tensor-parallel rank 0 exits at once
    (:func:`_exit_now`): under load, torch's C++ teardown at interpreter exit sometimes aborts
    ("terminate called without an active exception", exit -6 instead of 143; about 1 start in 9
    on a busy 2-core machine), and nothing of ours is left to run by then."""
    import signal

    tensor_parallel = (getattr(args, "tensor_parallel_size", 1) or 1) > 1
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if tensor_parallel else None
    code = 0
    try:
        code = int(serve() or 0)
    except _Terminated:
        code = 128 + signal.SIGTERM
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        for driver in jobs:
            driver.close()
            if driver.failed is not None:
                print(f"met serve: error: {driver.failed}", file=sys.stderr, flush=True)
                code = 1
    if tensor_parallel:
        _exit_now(code)
    return code


def _exit_now(code: int) -> None:
    """Flush the logs and standard streams, then leave without the interpreter's teardown."""
    from loguru import logger

    logger.complete()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def run(args, registry) -> int:

    from metrale_core.server import ServerConfig, create_app
    from metrale_core.server.runner import serve_forever

    model = _model_path(args)
    engine_config_from_args(args)  # fail fast on bad engine flags, before binding
    config = ServerConfig(
        served_model_name=args.served_model_name or served_name(model),
        api_key=args.api_key,
        max_body_bytes=args.max_body_bytes,
        max_waiting=args.max_waiting,
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
        shutdown_grace_s=args.shutdown_grace,
        pooling=args.pooling,
        responses_store_size=args.responses_store_size,
        stream_interval_ms=args.stream_interval_ms,
        max_tool_calls=args.max_tool_calls,
    )
    from metrale_core.tui.launch import use_dashboard

    if use_dashboard(args.no_tui)[0]:
        return _run_dashboard(args, registry, model, config)
    if args.log_level in ("warning", "error"):
        # requests are logged at INFO; show them (and only them) even at the default level
        from metrale_core.logs import show_request_lines

        show_request_lines("metrale_core.server.app")
    jobs: list = []
    app = create_app(config, serving_loader(args, registry, model, jobs=jobs), registry)
    print(
        f"met serve: {config.served_model_name!r} on http://{args.host}:{args.port}/v1 "
        f"(loading; GET /health turns 200 when ready)",
        file=sys.stderr,
        flush=True,
    )
    return _serving(args, jobs, lambda: serve_forever(app, args.host, args.port, args.shutdown_grace))


def _run_dashboard(args, registry, model, config) -> int:
    """``met serve`` on a terminal: the dashboard in this thread, the server on its own."""
    import metrale_core
    from metrale_core.server import create_app
    from metrale_core.tui.launch import observe_loader, serve_with_dashboard
    from metrale_core.tui.status import ServerStatus

    status = ServerStatus(version=metrale_core.__version__, model=config.served_model_name, scheduler=args.scheduler)
    jobs: list = []
    loader = serving_loader(args, registry, model, on_tensor=status.tensor_loaded, jobs=jobs)
    app = create_app(config, observe_loader(status, loader), registry)
    level = args.log_level if args.log_level in ("trace", "debug") else "info"
    return _serving(
        args,
        jobs,
        lambda: serve_with_dashboard(
            app, status, host=args.host, port=args.port, grace_s=args.shutdown_grace, log_level=level
        ),
    )
