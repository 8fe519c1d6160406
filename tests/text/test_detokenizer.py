"""IncrementalDetokenizer: whole characters only, no re-emission, concat(deltas) == decode(all),
bounded decode windows; on a one-token-per-byte vocabulary, on SmolLM2 and on a Metaspace one."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, pre_tokenizers

from metrale_core.testing.requires import missing
from metrale_core.text.detokenizer import IncrementalDetokenizer
from metrale_core.text.tokenizer import _BYTE_CHARS, Tokenizer

SMOL = Path.home() / ".cache" / "metrale" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def byte_tok() -> Tokenizer:
    """Ids 0/1 are special, 2..257 are the 256 single bytes (no merges): every UTF-8 byte is a token."""
    tokens = ["<s>", "</s>"] + [_BYTE_CHARS[b] for b in range(256)]
    return Tokenizer.from_gguf_metadata(
        {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [3, 3] + [1] * 256,
            "tokenizer.ggml.merges": [],
            "tokenizer.ggml.bos_token_id": 0,
            "tokenizer.ggml.eos_token_id": 1,
        }
    )


@pytest.fixture(scope="module")
def smol() -> Tokenizer:
    if not SMOL.is_file():
        missing(f"{SMOL} absent")
    return Tokenizer.from_gguf(SMOL)


def _stream(tok, prompt, ids, rng=None, skip_special_tokens=True, oracle=None):
    oracle = oracle or tok
    d = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip_special_tokens)
    deltas, i = [], 0
    while i < len(ids):
        k = rng.randrange(1, 4) if rng else 1
        deltas.append(d.push(ids[i : i + k]))
        assert oracle.decode(ids[: i + k], skip_special_tokens=skip_special_tokens).startswith(d.text)
        i += k
    return deltas, d


def test_multibyte_characters_come_out_whole(byte_tok):
    text = "hé 😀世!"
    ids = byte_tok.encode(text)
    assert len(ids) == len(text.encode())
    deltas, d = _stream(byte_tok, byte_tok.encode("prompt "), ids)
    assert "".join(deltas) == text and d.flush() == ""
    assert all("\ufffd" not in delta for delta in deltas)
    assert [x for x in deltas if x] == ["h", "é", " ", "😀", "世", "!"]
    # the emoji's first three bytes emit nothing; the fourth emits the whole emoji
    emoji_at = len("hé ".encode())
    assert deltas[emoji_at : emoji_at + 4] == ["", "", "", "😀"]


def test_flush_returns_an_unfinished_character(byte_tok):
    ids = byte_tok.encode("ok 😀")[:-2]  # stream stops inside the emoji
    deltas, d = _stream(byte_tok, [], ids)
    assert "".join(deltas) == "ok "
    tail = d.flush()
    assert tail and set(tail) == {"\ufffd"}
    assert "".join(deltas) + tail == byte_tok.decode(ids)
    assert d.flush() == "" and d.push([]) == ""


@pytest.mark.parametrize("seed", range(4))
def test_random_ids_concat_equals_decode_bytes(byte_tok, seed):
    rng = random.Random(seed)
    ids = [rng.randrange(byte_tok.vocab_size) for _ in range(300)]
    deltas, d = _stream(byte_tok, byte_tok.encode("ctx"), ids, rng)
    assert "".join(deltas) + d.flush() == byte_tok.decode(ids)


def test_special_tokens_skipped_or_kept(byte_tok):
    ids = [*byte_tok.encode("a"), 1, *byte_tok.encode("b")]
    assert "".join(_stream(byte_tok, [], ids)[0]) == "ab"
    assert "".join(_stream(byte_tok, [], ids, skip_special_tokens=False)[0]) == "a</s>b"


def test_decode_window_stays_small(byte_tok):
    calls = []

    class Counting:
        def decode(self, ids, skip_special_tokens=True):
            calls.append(len(ids))
            return byte_tok.decode(ids, skip_special_tokens)

    text = "mixed ascii, ünïcödé and 😀😀 emoji " * 30
    ids = byte_tok.encode(text)
    deltas, _ = _stream(Counting(), byte_tok.encode("a long prompt " * 20), ids, oracle=byte_tok)
    assert "".join(deltas) == text
    assert max(calls) <= 8  # context + an emoji's 4 bytes, never the whole sequence
    assert len(calls) <= 2 * len(ids) + 1


def test_smollm2_unicode_and_random(smol):
    text = "Paris 🇫🇷 is 巴黎; naïve 👨‍👩‍👧 ok"
    ids = smol.encode(text)
    deltas, d = _stream(smol, smol.encode_chat([{"role": "user", "content": "hi"}]), ids)
    assert "".join(deltas) == text and d.flush() == ""
    assert all("\ufffd" not in x for x in deltas)
    rng = random.Random(7)
    for _ in range(40):
        rand = [rng.randrange(smol.vocab_size) for _ in range(rng.randrange(1, 60))]
        deltas, d = _stream(smol, [1, 2, 3], rand, rng)
        assert "".join(deltas) + d.flush() == smol.decode(rand)


def test_metaspace_leading_space_kept_in_context():
    vocab = {"<unk>": 0, "▁Hello": 1, "▁world": 2, "!": 3}
    backend = Backend(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()

    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    assert backend.decode([2]) == "world"  # alone, the leading space is stripped
    d = IncrementalDetokenizer(Tok(), [1])
    assert [d.push([2]), d.push([3])] == [" world", "!"]
