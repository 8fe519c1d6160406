"""Input guards that run before any engine work: JSON shape, vocabulary and size bounds.

Owner: the server (``decode.parse_body``, ``generation.plan_jobs``, the chat / completions /
tokenize routes).  Each guard raises :class:`~metrale_core.server.errors.APIError` 400 naming
the offending field and the limit, so a bad value never reaches the tokenizer, the template or
the engine step (where it would fail other requests).

Invariants:
- A body nested deeper than :data:`MAX_JSON_DEPTH` or holding a lone UTF-16 surrogate (which
  no tokenizer can encode) is a 400 with the path of the value.
- ``logit_bias`` has at most :data:`MAX_LOGIT_BIAS` entries, each naming a token id inside the
  model's vocabulary; ``stop`` has at most :data:`MAX_STOP` strings of at most
  :data:`MAX_STOP_CHARS` characters each.
- A prompt whose character count already exceeds what the context can hold
  (``max_model_len`` tokens x the longest token, with slack) is refused before it is
  tokenized, so a 16 MB prompt costs a length check, not a tokenizer pass.
"""

from __future__ import annotations

from typing import Any

import msgspec

from metrale_core.server.errors import APIError

__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_LOGIT_BIAS",
    "MAX_STOP",
    "MAX_STOP_CHARS",
    "check_bias_vocab",
    "check_json",
    "check_prompt_chars",
    "join_path",
    "max_prompt_chars",
]

#: Deepest nesting of arrays/objects accepted in a request body.
MAX_JSON_DEPTH = 64
#: Most ``logit_bias`` entries per request (OpenAI's limit).
MAX_LOGIT_BIAS = 300
#: Most stop strings per request, and the longest one.
MAX_STOP = 16
MAX_STOP_CHARS = 1024


def join_path(path: str, part: str | int) -> str:
    """``path`` extended by a field name (``a.b``) or an array index (``a[0]``)."""
    if isinstance(part, int):
        return f"{path}[{part}]"
    return f"{path}.{part}" if path else part


def _bad_unicode(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check_json(data: Any) -> None:
    """400 for nesting deeper than :data:`MAX_JSON_DEPTH` or a lone surrogate anywhere in
    ``data``: plain JSON values, or a decoded request record (a record counts as an object)."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, str):
            if _bad_unicode(value):
                raise APIError(
                    400,
                    f"{path or 'body'}: contains a lone UTF-16 surrogate "
                    f"(e.g. \\ud800), which is not valid Unicode text",
                    param=path or None,
                )
            continue
        if isinstance(value, msgspec.Struct):
            value = {name: getattr(value, name) for name in value.__struct_fields__}
        elif not isinstance(value, (dict, list)):
            continue
        if depth >= MAX_JSON_DEPTH:
            raise APIError(400, f"{path or 'body'}: nested deeper than {MAX_JSON_DEPTH} levels", param=path or None)
        if isinstance(value, dict):
            for key, item in value.items():
                if _bad_unicode(key):
                    raise APIError(
                        400,
                        f"{path or 'body'}: a key contains a lone UTF-16 surrogate, which is not valid Unicode text",
                        param=path or None,
                    )
                stack.append((item, join_path(path, key), depth + 1))
        else:
            stack.extend((item, join_path(path, i), depth + 1) for i, item in enumerate(value))


def check_bias_vocab(logit_bias: dict[str, float] | None, vocab_size: int) -> None:
    """400 when a ``logit_bias`` key is not a token id of the model."""
    for key in logit_bias or {}:
        token = int(key)
        if not 0 <= token < vocab_size:
            raise APIError(
                400,
                f"logit_bias.{key}: token id {token} is outside the model's vocabulary [0, {vocab_size})",
                param=f"logit_bias.{key}",
            )


_MAX_TOKEN_CHARS: dict[int, tuple[Any, int]] = {}


def _max_token_chars(tokenizer: Any) -> int:
    """The most characters one token can stand for (an upper bound; cached per tokenizer)."""
    hit = _MAX_TOKEN_CHARS.get(id(tokenizer))
    if hit is not None and hit[0] is tokenizer:
        return hit[1]
    longest = 16
    backend = getattr(tokenizer, "backend", None)
    if backend is not None:
        try:
            longest = max((len(t) for t in backend.get_vocab(with_added_tokens=True)), default=16)
        except Exception:
            longest = 64
    _MAX_TOKEN_CHARS[id(tokenizer)] = (tokenizer, longest)
    return longest


def max_prompt_chars(tokenizer: Any, max_model_len: int) -> int:
    """Characters beyond which a prompt cannot fit ``max_model_len`` tokens (x2 slack for
    normalizers that drop characters)."""
    return 2 * max_model_len * max(1, _max_token_chars(tokenizer)) + 1024


def check_prompt_chars(chars: int, tokenizer: Any, max_model_len: int, param: str) -> None:
    """400 before tokenizing when ``chars`` characters cannot fit the context."""
    limit = max_prompt_chars(tokenizer, max_model_len)
    if chars > limit:
        raise APIError(
            400,
            f"{param}: the prompt has {chars} characters, more than this model's "
            f"context of {max_model_len} tokens can hold (at most {limit} "
            f"characters); shorten it",
            param=param,
            code="context_length_exceeded",
        )
