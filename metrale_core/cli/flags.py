"""The one definition of the engine flags, shared by ``met generate`` and ``met serve``.

Owner: the CLI.  Plugins add their own flags through the ``metrale_engine_flags`` hook, which
receives the same argparse group.

Invariants:
- Every flag maps to one :class:`metrale_core.engine.EngineConfig` field or one model-loading
  option; :func:`engine_config_from_args` is the only place that maps them.  The flags plugins
  add land, by ``dest``, in ``EngineConfig.plugin_options``.
- Sizes accept ``512M`` / ``2G`` / plain bytes; a bad value is an argparse error naming the flag.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import TypeVar

__all__ = [
    "add_engine_flags",
    "add_size_flag",
    "engine_config_from_args",
    "load_engine_model",
    "load_options_from_args",
    "number_type",
    "parse_size",
    "positive_float",
    "positive_int",
]

_N = TypeVar("_N", int, float)

#: Namespace attribute listing the dests of the flags plugins added (-> ``plugin_options``).
PLUGIN_FLAGS_DEST = "_metrale_plugin_flags"

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Parse ``"512M"``, ``"1.5G"``, ``"2GiB"`` or ``"1048576"`` into bytes."""
    match = _SIZE_RE.match(str(text))
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 512M or 2G)")
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
    return int(value)


def number_type(
    convert: Callable[[str], _N], ok: Callable[[_N], bool], requirement: str, noun: str = "a number"
) -> Callable[[str], _N]:
    """An argparse ``type=`` for numbers: ``convert(text)`` (``int``, ``float``) that must pass
    ``ok``; else the argparse error ``not <noun>: '<text>'`` or ``must be <requirement>, got
    <text>``.  Plugins build their flags' types with it (``metrale_core.api``)."""

    def parse(text: str) -> _N:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {noun}: {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {requirement}, got {text}")
        return value

    return parse


positive_int = number_type(int, lambda value: value > 0, "> 0", "an integer")
positive_float = number_type(float, lambda value: value > 0, "> 0")


def add_size_flag(group: argparse._ActionsContainer, flag: str, default: str, help: str) -> None:
    """Add ``flag SIZE`` (bytes, with a K/M/G/T suffix: :func:`parse_size`) defaulting to
    ``default``, which its help names."""
    group.add_argument(
        flag, type=parse_size, default=parse_size(default), metavar="SIZE", help=f"{help} (default: {default})"
    )


def add_engine_flags(parser: argparse.ArgumentParser, registry=None) -> argparse._ArgumentGroup:
    """Add the model and engine flags to ``parser``; plugins add theirs to the same group."""
    model = parser.add_argument_group("model")
    model.add_argument(
        "--model",
        "-m",
        metavar="PATH",
        default=None,
        help="HF checkpoint directory, .gguf file or hub name ORG/NAME[:QUANT] (default: the embedded "
        "SmolLM2-135M-Instruct, fetched on first use)",
    )
    model.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default="float32",
        help="activation and weight dtype (default: float32)",
    )
    model.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    model.add_argument(
        "--weight-format",
        choices=("auto", "exact", "bf16", "int8", "int4"),
        default=None,
        help="how linear weights are kept on CPU: auto (the default: each tensor in its "
        "checkpoint's own precision -- a GGUF runs on its own quantized blocks, "
        "bf16/fp32 tensors in bf16/fp32; batch-invariant), exact (dequantized to the "
        "model dtype; reproduces the reference outputs), or bf16 / int8 / int4 "
        "(measured in docs/user-guide.md) (default: $METRALE_WEIGHT_FORMAT or auto)",
    )
    model.add_argument(
        "--tensor-parallel-size",
        type=positive_int,
        default=1,
        metavar="N",
        help="split the model over N ranks (tensor parallelism; each rank keeps its shard of the "
        "weights and of the KV cache, --kv-cache-memory each; default: 1)",
    )
    model.add_argument(
        "--distributed-executor-backend",
        default=None,
        metavar="NAME",
        help="where the ranks run: mp (worker processes here; the default for N > 1), "
        "env (ranks started by torchrun / 'met worker': MASTER_ADDR, MASTER_PORT, "
        "WORLD_SIZE, RANK), ray (the metrale-ray plugin) or uni (one process)",
    )
    model.add_argument(
        "--distributed-timeout",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="how long a tensor-parallel collective (and a remote data-parallel replica's link) waits "
        "for a silent rank or host before the job is declared lost (default: 60)",
    )
    model.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        metavar="N",
        help="CPU threads for torch's kernels (default: torch's choice, one per core)",
    )

    group = parser.add_argument_group("engine")
    add_size_flag(group, "--kv-cache-memory", "512M", "bytes for the paged KV cache pool")
    group.add_argument(
        "--kv-cache-dtype",
        default=None,
        metavar="DTYPE",
        help="KV cache storage: bf16, fp16, fp32, q8_0 (llama.cpp's int8 blocks, CPU) or fp8 "
        "(E4M3, needs the metrale-fp8 plugin) (default: the model dtype)",
    )
    group.add_argument("--block-size", type=positive_int, default=16, help="tokens per KV block (default: 16)")
    group.add_argument(
        "--max-prefill-tokens",
        type=positive_int,
        default=2048,
        help="prompt tokens prefilled per step; longer prompts are chunked (default: 2048)",
    )
    group.add_argument("--max-num-seqs", type=positive_int, default=64, help="sequences running at once (default: 64)")
    add_size_flag(
        group,
        "--recurrent-state-memory",
        "4G",
        "bytes for the recurrent-state slots of linear-attention models; caps the sequences running at once",
    )
    group.add_argument(
        "--max-model-len",
        type=positive_int,
        default=None,
        help="longest prompt + output (default: the model's context)",
    )
    group.add_argument(
        "--no-prefix-caching",
        dest="enable_prefix_caching",
        action="store_const",
        const=False,
        default=None,
        help="turn prefix caching off (on by default for pure-attention models)",
    )
    group.add_argument("--scheduler", default="fcfs", help="scheduling policy plugin (default: fcfs)")
    group.add_argument("--sampler", default="default", help="sampler plugin (default: default)")
    group.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="finish a request with finish_reason 'timeout' after this long",
    )
    if registry is not None:
        before = len(group._group_actions)
        registry.add_engine_flags(group)
        added = tuple(action.dest for action in group._group_actions[before:])
        parser.set_defaults(**{PLUGIN_FLAGS_DEST: added})
    return group


def engine_config_from_args(args: argparse.Namespace):
    """Build the :class:`EngineConfig` the flags describe."""
    from metrale_core.engine import EngineConfig

    return EngineConfig(
        block_size=args.block_size,
        kv_cache_memory=args.kv_cache_memory,
        max_prefill_tokens=args.max_prefill_tokens,
        max_num_seqs=args.max_num_seqs,
        recurrent_state_memory=args.recurrent_state_memory,
        max_model_len=args.max_model_len,
        enable_prefix_caching=args.enable_prefix_caching,
        request_timeout_s=args.request_timeout,
        scheduler=args.scheduler,
        sampler=args.sampler,
        kv_cache_dtype=args.kv_cache_dtype,
        plugin_options={dest: getattr(args, dest) for dest in getattr(args, PLUGIN_FLAGS_DEST, ())},
    )


def load_options_from_args(args: argparse.Namespace):
    """Build the :class:`LoadOptions` the flags describe; applies ``--threads`` (process-wide, so
    it holds for the engine thread too)."""
    from metrale_core.plugin.components import LoadOptions

    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)
    return LoadOptions(dtype=args.dtype, device=args.device, weight_format=args.weight_format)


def load_engine_model(args: argparse.Namespace, registry, model, *, progress: bool = True, on_tensor=None):
    """The ``LoadedModel`` the flags describe: over ``--tensor-parallel-size`` ranks through the
    ``--distributed-executor-backend`` executor (plain ``load_model`` for one rank).  On CPU without
    ``--threads`` each rank of the ``mp`` executor gets an equal share of this machine's cores."""
    from metrale_core.hub import resolve_model_arg
    from metrale_core.parallel.launch import check_engine_config, load_parallel

    model = resolve_model_arg(model)  # a hub name (ORG/NAME[:QUANT]) -> its path in the HF cache
    size = getattr(args, "tensor_parallel_size", 1) or 1
    check_engine_config(engine_config_from_args(args), size)
    options = load_options_from_args(args)
    threads = getattr(args, "threads", None)
    backend = getattr(args, "distributed_executor_backend", None)
    if threads is None and size > 1 and options.device == "cpu" and backend in (None, "mp"):
        import os

        import torch

        threads = max(1, (os.cpu_count() or 1) // size)  # the mp ranks share this machine's cores
        torch.set_num_threads(threads)
    return load_parallel(
        model,
        options,
        registry,
        size=size,
        backend=backend,
        threads=threads,
        progress=progress,
        on_tensor=on_tensor,
        timeout_s=getattr(args, "distributed_timeout", None),
    )
