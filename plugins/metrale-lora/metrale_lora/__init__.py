"""Metrale plugin: multi-LoRA serving (many PEFT adapters on one base model, batched together).

Owner: ``metrale_lora``.  Registers the flags ``--lora NAME=PATH`` (repeatable), ``--max-loras``,
``--max-lora-rank`` and ``--allow-runtime-lora`` through ``metrale_engine_flags`` and, through
``metrale_engine_started``, turns them into the engine's ``AdapterBank`` (the core's seam:
projections wrapped, per-row adapter map per step, adapter-keyed prefix cache) with
:func:`metrale_lora.adapter_files.load_adapter` as its loader (PEFT directories and llama.cpp
LoRA GGUF files).  The server picks an adapter by the
request's ``model`` and serves ``/v1/load_lora_adapter`` / ``/v1/unload_lora_adapter``.

Invariants:
- Importing this package imports neither torch nor safetensors (``met plugins`` stays fast).
- An engine gets a bank only when adapters are named or runtime loading is allowed; otherwise
  the model is untouched.
- One bad ``--lora`` adapter is logged naming its file and skipped; the others still load and
  the server still serves.
"""

from __future__ import annotations

from loguru import logger

from metrale_core import hookimpl
from metrale_core.api import ConfigError

__all__ = ["DEFAULT_MAX_LORAS", "DEFAULT_MAX_RANK", "metrale_engine_flags", "metrale_engine_started", "parse_lora_flag"]

DEFAULT_MAX_LORAS = 4
DEFAULT_MAX_RANK = 64


def parse_lora_flag(value: str) -> tuple[str, str]:
    """``NAME=PATH`` -> ``(name, path)``; a ``ConfigError`` for anything else."""
    name, sep, path = value.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise ConfigError(f"--lora takes NAME=PATH, got {value!r}")
    return name.strip(), path.strip()


@hookimpl
def metrale_engine_flags(parser) -> None:
    """``--lora NAME=PATH`` (repeatable), ``--max-loras``, ``--max-lora-rank``, ``--allow-runtime-lora``."""
    parser.add_argument(
        "--lora",
        dest="lora",
        action="append",
        default=None,
        metavar="NAME=PATH",
        help="serve the LoRA adapter at PATH as model NAME: a PEFT adapter directory or a "
        "llama.cpp LoRA .gguf (repeatable)",
    )
    parser.add_argument(
        "--max-loras",
        dest="max_loras",
        type=int,
        default=DEFAULT_MAX_LORAS,
        help=f"LoRA adapters resident at once; beyond, least recently used ones are "
        f"evicted (default {DEFAULT_MAX_LORAS})",
    )
    parser.add_argument(
        "--max-lora-rank",
        dest="max_lora_rank",
        type=int,
        default=DEFAULT_MAX_RANK,
        help=f"largest LoRA rank accepted (default {DEFAULT_MAX_RANK})",
    )
    parser.add_argument(
        "--allow-runtime-lora",
        dest="allow_runtime_lora",
        action="store_true",
        default=False,
        help="enable POST /v1/load_lora_adapter and /v1/unload_lora_adapter",
    )


@hookimpl
def metrale_engine_started(engine) -> None:
    """Build ``engine``'s adapter bank from the flags and load every ``--lora`` adapter."""
    options = engine.config.plugin_options
    adapters = [parse_lora_flag(v) for v in options.get("lora") or ()]
    runtime = bool(options.get("allow_runtime_lora"))
    if not adapters and not runtime:
        return
    from metrale_lora.adapter_files import adapter_loader
    from metrale_lora.engine_setup import enable_adapters

    bank = enable_adapters(
        engine,
        int(options.get("max_loras") or DEFAULT_MAX_LORAS),
        int(options.get("max_lora_rank") or DEFAULT_MAX_RANK),
        loader=adapter_loader(engine.runner.model),
    )
    bank.allow_runtime = runtime
    for name, path in adapters:
        try:
            bank.load(name, path)
        except ConfigError as exc:
            logger.error("LoRA adapter {!r} not loaded: {}", name, exc)
        else:
            logger.info("LoRA adapter {!r} loaded from {}", name, path)
