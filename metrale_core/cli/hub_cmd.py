"""``met pull`` / ``met models`` / ``met rm``: models by Hugging Face hub name in the HF cache.

Owner: the CLI (registered by ``metrale_core.cli.main``).

Invariants:
- ``met pull`` prints the local path on stdout (progress bars on stderr); ``met models`` prints a
  table; failures are one-line ``MetraleError``s (exit 2 through ``main``).
"""

from __future__ import annotations

__all__ = ["add_parser"]


def add_parser(sub, registry) -> None:
    pull = sub.add_parser(
        "pull",
        help="download a model by hub name into the HF cache",
        description="Download ORG/NAME (safetensors + tokenizer + config), ORG/NAME:QUANT or "
        "ORG/NAME/FILE.gguf from $HF_ENDPOINT (default huggingface.co) into the HF cache; needs network.",
    )
    pull.add_argument("name", metavar="ORG/NAME[:QUANT]")
    pull.set_defaults(func=_run_pull)
    models = sub.add_parser("models", help="list the models in the HF cache with their sizes")
    models.set_defaults(func=_run_models)
    rm = sub.add_parser("rm", help="remove a model from the HF cache")
    rm.add_argument("name", metavar="ORG/NAME")
    rm.set_defaults(func=_run_rm)


def _run_pull(args, registry) -> int:
    from metrale_core.hub import fetch_model, parse_spec

    print(fetch_model(parse_spec(args.name)))
    return 0


def _run_models(args, registry) -> int:
    from metrale_core.hub.cache import cached_models, format_models

    print(format_models(cached_models()))
    return 0


def _run_rm(args, registry) -> int:
    from metrale_core.hub.cache import remove_model

    freed = remove_model(args.name)
    print(f"removed {args.name} ({freed / (1 << 20):.1f} MB)")
    return 0
