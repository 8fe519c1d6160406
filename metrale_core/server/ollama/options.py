"""Ollama's ``options`` object -> the chat request's sampling fields.

Owner: ``server.ollama.translate``.  :func:`sampling_fields` checks each option Ollama documents
that changes sampling here, by type (a 400 naming ``options.X``), and maps it; the chat path then
range-checks the values exactly as for ``/v1/chat/completions`` (its errors renamed to
``options.X`` by the route, see :data:`CHAT_NAMES`).

Mapping: ``num_predict`` -> ``max_tokens`` (``-1``/``-2``: no limit but the context, as Ollama),
``temperature``, ``top_p``, ``top_k``, ``min_p``, ``seed``, ``stop`` (a string or strings),
``repeat_penalty`` -> ``repetition_penalty``, ``presence_penalty``, ``frequency_penalty``.

Invariants:
- Options that only tune Ollama's own runtime (``num_ctx``, ``num_batch``, ``num_gpu``,
  ``num_thread``, ``use_mmap``, ``numa``, ...) and unknown keys are accepted and ignored, as Ollama
  ignores options a model does not use; the context is the server's ``--max-model-len``.
- A wrongly typed option is a 400 (``options.temperature: must be a number``), never a 500.
"""

from __future__ import annotations

from typing import Any

from metrale_core.server.errors import APIError

__all__ = ["CHAT_NAMES", "sampling_fields"]

#: option -> (chat field, expected JSON kind)
_MAPPED: dict[str, tuple[str, str]] = {
    "temperature": ("temperature", "number"),
    "top_p": ("top_p", "number"),
    "top_k": ("top_k", "integer"),
    "min_p": ("min_p", "number"),
    "seed": ("seed", "integer"),
    "repeat_penalty": ("repetition_penalty", "number"),
    "presence_penalty": ("presence_penalty", "number"),
    "frequency_penalty": ("frequency_penalty", "number"),
}

#: chat field -> the option a client sent it as (to rename the chat path's range errors).
CHAT_NAMES: dict[str, str] = {
    **{chat: f"options.{option}" for option, (chat, _) in _MAPPED.items()},
    "max_tokens": "options.num_predict",
    "stop": "options.stop",
}


def _bad(option: str, rule: str) -> APIError:
    return APIError(400, f"options.{option}: {rule}", param=f"options.{option}")


def _typed(option: str, value: Any, kind: str) -> Any:
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if kind == "integer":
        if is_int:
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise _bad(option, f"must be an integer, got {value!r}")
    if is_int or isinstance(value, float):
        return float(value)
    raise _bad(option, f"must be a number, got {value!r}")


def _stop(value: Any) -> list[str]:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _bad("stop", "must be a string or an array of strings")
    return [s for s in stops if s]


def _max_tokens(value: Any) -> int | None:
    n = _typed("num_predict", value, "integer")
    if n in (-1, -2):  # Ollama: infinite generation / fill the context
        return None
    if n < 1:
        raise _bad("num_predict", f"must be >= 1, or -1 for no limit, got {n}")
    return n


def sampling_fields(options: dict[str, Any] | None) -> dict[str, Any]:
    """The ``ChatCompletionRequest`` keyword arguments that ``options`` sets."""
    out: dict[str, Any] = {}
    for option, value in (options or {}).items():
        if value is None:
            continue
        if option in _MAPPED:
            chat, kind = _MAPPED[option]
            out[chat] = _typed(option, value, kind)
        elif option == "num_predict":
            out["max_tokens"] = _max_tokens(value)
        elif option == "stop":
            out["stop"] = _stop(value) or None
    return out
