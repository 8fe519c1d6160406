"""The ``tokenizers`` backend of a GGUF SentencePiece vocabulary (``tokenizer.ggml.model == "llama"``).

Owner: ``metrale_core.text.tokenizer`` (``Tokenizer.from_gguf_metadata`` calls :func:`spm_backend`).

Invariants:
- The vocabulary is a byte-fallback BPE whose merges come from the piece scores (a pair merges
  when the concatenation is a piece; higher-scoring pieces first), which is llama.cpp's SPM
  tokenizer (it merges the best-scoring adjacent pair until none is left) and transformers'
  GGUF conversion of the same file.
- Spaces become ``▁``; a leading ``▁`` is prepended only when ``tokenizer.ggml.add_space_prefix``
  is true (llama.cpp's default for SPM; Gemma writes false).  Decoding reverses both.
- CONTROL tokens are special added tokens and USER_DEFINED ones plain added tokens, matched
  whole in the text, as in the byte-level path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tokenizers import AddedToken, decoders, models, normalizers
from tokenizers import Tokenizer as _Backend

__all__ = ["spm_backend"]

_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


def _merges(vocab: Mapping[str, int], scores: Sequence[float]) -> list[tuple[str, str]]:
    """Every split ``(left, right)`` of a piece into two pieces, best-scoring merged piece first."""
    found = []
    for piece, index in vocab.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                found.append((scores[index], len(left), len(right), left, right))
    found.sort(key=lambda m: (m[0], m[1], m[2]), reverse=True)
    return [(m[3], m[4]) for m in found]


def spm_backend(meta: Mapping[str, Any], tokens: Sequence[str], types: Sequence[int]) -> _Backend:
    """The backend for GGUF metadata ``meta`` whose vocabulary is ``tokens`` / ``types``."""
    scores = list(meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens))
    vocab: dict[str, int] = {}
    added: list[AddedToken] = []
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    for index, (token, ttype) in enumerate(zip(tokens, types, strict=False)):
        if ttype in (_CONTROL, _USER_DEFINED):
            added.append(AddedToken(token, special=ttype == _CONTROL, normalized=False))
        vocab.setdefault(token, index)
    mergeable = {t: i for t, i in vocab.items() if types[i] == _NORMAL}
    unk_token = tokens[int(unk)] if unk is not None and 0 <= int(unk) < len(tokens) else None
    backend = _Backend(
        models.BPE(
            vocab=vocab,
            merges=_merges(mergeable, scores),
            unk_token=unk_token,
            fuse_unk=True,
            byte_fallback=True,
            dropout=None,
        )
    )
    steps: list[normalizers.Normalizer] = [normalizers.Replace(" ", "▁")]
    decode: list[decoders.Decoder] = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if bool(meta.get("tokenizer.ggml.add_space_prefix", True)):
        steps.insert(0, normalizers.Prepend("▁"))
        decode.append(decoders.Strip(" ", 1, 0))
    backend.normalizer = normalizers.Sequence(steps)
    backend.decoder = decoders.Sequence(decode)
    backend.add_special_tokens([t for t in added if t.special])
    backend.add_tokens([t for t in added if not t.special])
    return backend
