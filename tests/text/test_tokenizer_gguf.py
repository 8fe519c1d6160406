"""Tokenizer built from GGUF metadata: the real SmolLM2 file against the reference ids in
models.md and against transformers' own GGUF tokenizer; synthetic metadata for the edge paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from metrale_core.errors import WeightsError
from metrale_core.testing.requires import missing, needs_file
from metrale_core.testing.smollm2 import CAPITAL_CHAT_IDS
from metrale_core.text.tokenizer import Tokenizer, TokenizerError, read_gguf_metadata

SMOL = Path.home() / ".cache" / "metrale" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
needs_smol = needs_file(SMOL, "met pulls it on first use; scripts/fetch-test-data.sh fetches it")

CHAT_IDS = list(CAPITAL_CHAT_IDS)

TEXTS = [
    "Once upon a time",
    "In 2024 I had 12345 apples.",
    "",
    " ",
    "   leading and trailing   ",
    "tabs\tand\nnewlines\r\n\n\nend",
    "Hello, world! How's it going? I'm fine; you'll see.",
    "naïve café résumé — “quotes” ‘single’ … ellipsis",
    "Grüße aus Köln: Straße, Fußgänger",
    "日本語のテキストと中文混合",
    "한국어 텍스트입니다",
    "Привет, мир! Как дела?",
    "مرحبا بالعالم",
    "emoji 😀👍🏽👨‍👩‍👧‍👦 🇫🇷 ❤️ done",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { a[i] += b[i]; }",
    '{"key": [1, 2.5, null, true], "nested": {"a": "b"}}',
    "3.14159 2.71828 1e-10 0xDEADBEEF 1,000,000",
    "phone: +1-555-0100, date 2024-12-31T23:59:59Z",
    "<|im_start|>user\nhi<|im_end|>\n",
    "text with <|endoftext|> inside and <file_sep> too",
    "<|im_start|><|im_end|><|im_start|>",
    "a" * 50,
    "    indented code\n\t\ttabbed",
    "mixedCASE camelCase snake_case SCREAMING_CASE kebab-case",
    "URL https://example.com/path?q=1&r=two#frag",
    "math: ∑_{i=1}^n x_i ≤ ∞, α β γ δ",
    "zero\u200bwidth\u00a0nbsp",
    "ＦＵＬＬ－ＷＩＤＴＨ ｔｅｘｔ",
    "trailing newline\n",
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    if not SMOL.is_file():
        missing(f"{SMOL} absent")
    return Tokenizer.from_gguf(SMOL)


@pytest.fixture(scope="module")
def hf_tok():
    import transformers

    if not SMOL.is_file():
        missing(f"{SMOL} absent")
    return transformers.AutoTokenizer.from_pretrained(str(SMOL.parent), gguf_file=SMOL.name)


@needs_smol
def test_special_ids_and_flags(tok):
    assert tok.bos_token_id == 1
    assert tok.eos_token_ids == (2,)
    assert tok.pad_token_id == 2
    assert tok.vocab_size == 49152
    assert tok.special_token_ids == frozenset(range(17))
    assert tok.id_to_token(1) == "<|im_start|>" and tok.token_to_id("<|im_end|>") == 2
    assert tok.special_tokens["eos_token"] == "<|im_end|>" and tok.special_tokens["unk_token"] == "<|endoftext|>"
    assert "<|im_start|>" in tok.chat_template


@needs_smol
def test_reference_ids(tok):
    assert tok.encode("Once upon a time") == [6403, 1980, 253, 655]
    # add_bos_token is False in this file: special tokens add nothing
    assert tok.encode("Once upon a time", add_special_tokens=True) == tok.encode("Once upon a time", False)
    ids = tok.encode("In 2024 I had 12345 apples.")
    assert [tok.id_to_token(i) for i in ids] == [
        "In",
        "Ġ",
        "2",
        "0",
        "2",
        "4",
        "ĠI",
        "Ġhad",
        "Ġ",
        "1",
        "2",
        "3",
        "4",
        "5",
        "Ġapples",
        ".",
    ]
    assert tok.encode_chat([{"role": "user", "content": "What is the capital of France?"}]) == CHAT_IDS
    assert tok.decode([504, 3575, 282, 4649, 314, 7042, 30, 2]) == "The capital of France is Paris."
    assert tok.decode([504, 3575, 282, 4649, 314, 7042, 30, 2], skip_special_tokens=False) == (
        "The capital of France is Paris.<|im_end|>"
    )


@needs_smol
@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids, skip_special_tokens=False) == text


@needs_smol
def test_special_tokens_are_matched_whole(tok):
    ids = tok.encode("a<|im_end|>b")
    assert 2 in ids and len(ids) == 3
    assert tok.decode(ids) == "ab"


@needs_smol
def test_matches_transformers(tok, hf_tok):
    for text in TEXTS:
        ours = tok.encode(text, add_special_tokens=False)
        assert ours == hf_tok.encode(text, add_special_tokens=False), text
        assert tok.encode(text) == hf_tok.encode(text), text
        assert tok.decode(ours) == hf_tok.decode(ours, skip_special_tokens=True), text
        assert tok.decode(ours, skip_special_tokens=False) == hf_tok.decode(ours, skip_special_tokens=False), text


@needs_smol
def test_from_store_uses_gguf_metadata(tok):
    from metrale_core import weights

    store = weights.open_weights(SMOL)
    from_store = Tokenizer.from_store(store)
    assert from_store.encode("Once upon a time") == [6403, 1980, 253, 655]
    assert from_store.eos_token_ids == tok.eos_token_ids and from_store.chat_template == tok.chat_template


@needs_smol
def test_read_gguf_metadata_keys():
    meta = read_gguf_metadata(SMOL)
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["general.architecture"] == "llama"
    assert len(meta["tokenizer.ggml.tokens"]) == 49152 and len(meta["tokenizer.ggml.merges"]) == 48900


# ---- synthetic metadata ------------------------------------------------------------------------


def _meta(**extra):
    # a byte-level vocabulary: the 256 byte characters, two merges, one control and one user token
    from metrale_core.text.tokenizer import _BYTE_CHARS

    tokens = ["<s>", "</s>"] + [_BYTE_CHARS[b] for b in range(256)] + ["he", "hel", "<think>"]
    types = [3, 3] + [1] * 256 + [1, 1, 4]
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": ["h e", "he l"],
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 1,
    }
    meta.update(extra)
    return meta


def test_synthetic_bos_eos_flags_and_added_tokens():
    plain = Tokenizer.from_gguf_metadata(_meta())
    hel = plain.token_to_id("hel")
    assert plain.encode("hello") == [hel, plain.token_to_id("l"), plain.token_to_id("o")]
    with_bos = Tokenizer.from_gguf_metadata(
        _meta(**{"tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True})
    )
    assert with_bos.encode("hello") == [0, *plain.encode("hello"), 1]
    assert with_bos.encode("hello", add_special_tokens=False) == plain.encode("hello")
    # USER_DEFINED tokens stay whole but are not special: decode keeps them
    think = plain.token_to_id("<think>")
    assert plain.encode("<think>hel") == [think, hel]
    assert plain.decode([think, hel]) == "<think>hel"
    assert plain.decode([0, hel, 1]) == "hel"
    assert plain.special_token_ids == frozenset({0, 1})


def test_synthetic_eot_joins_eos_ids_and_chat_template():
    template = "{{ bos_token }}{{ messages[0]['content'] }}"
    tok = Tokenizer.from_gguf_metadata(_meta(**{"tokenizer.ggml.eot_token_id": 0, "tokenizer.chat_template": template}))
    assert tok.eos_token_ids == (1, 0)
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "<s>x"


def test_harmony_vocab_ends_turns_at_return_and_call():
    """gpt-oss GGUFs name one EOS; <|call|> must stop generation too (as llama.cpp and HF do)."""
    from metrale_core.text.tokenizer import _BYTE_CHARS

    tokens = ["<|endoftext|>", "<|start|>", "<|end|>", "<|return|>", "<|call|>"] + [_BYTE_CHARS[b] for b in range(256)]
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3] * 5 + [1] * 256,
        "tokenizer.ggml.merges": [],
        "tokenizer.ggml.eos_token_id": 3,
    }
    assert Tokenizer.from_gguf_metadata(meta).eos_token_ids == (3, 4)  # <|end|> (2) is not an end of turn
    without_call = {**meta, "tokenizer.ggml.tokens": [t if t != "<|call|>" else "<|other|>" for t in tokens]}
    assert Tokenizer.from_gguf_metadata(without_call).eos_token_ids == (3,)


def test_non_ascii_vocab_entries_are_respelled_to_bytes():
    meta = _meta()
    meta["tokenizer.ggml.tokens"] = meta["tokenizer.ggml.tokens"] + ["中"]  # stored raw, outside the byte alphabet
    meta["tokenizer.ggml.token_type"] = meta["tokenizer.ggml.token_type"] + [1]
    tok = Tokenizer.from_gguf_metadata(meta)
    assert tok.decode([len(meta["tokenizer.ggml.tokens"]) - 1]) == "中"


def test_unsupported_tokenizer_type_is_a_weights_error():
    with pytest.raises(TokenizerError, match="'bert' is not supported") as info:
        Tokenizer.from_gguf_metadata(_meta(**{"tokenizer.ggml.model": "bert"}), source="x.gguf")
    assert isinstance(info.value, WeightsError)


def test_unreadable_gguf(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(TokenizerError, match="cannot read GGUF metadata"):
        Tokenizer.from_gguf(bad)


def test_control_tokens_outside_the_byte_alphabet_stay_raw():
    # DeepSeek-style specials use characters a byte-level vocabulary never spells; llama.cpp keeps them raw
    from metrale_core.text.tokenizer import _BYTE_CHARS

    tokens = ["<｜begin▁of▁sentence｜>", "<｜User｜>"] + [_BYTE_CHARS[b] for b in range(256)]
    tok = Tokenizer.from_gguf_metadata(
        {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [3, 4] + [1] * 256,
            "tokenizer.ggml.bos_token_id": 0,
            "tokenizer.ggml.add_bos_token": True,
        }
    )
    ids = tok.encode("<｜User｜>hé")
    assert ids[:2] == [0, 1] and len(ids) == 5
    assert tok.decode(ids, skip_special_tokens=False) == "<｜begin▁of▁sentence｜><｜User｜>hé"
    assert tok.decode(ids) == "<｜User｜>hé"


def test_metadata_without_tokens():
    with pytest.raises(TokenizerError, match=r"no tokenizer.ggml.tokens"):
        Tokenizer.from_gguf_metadata({"general.architecture": "llama"}, source="w.gguf")


# --- SentencePiece GGUF vocabularies (tokenizer.ggml.model == "llama", Gemma) -----------------------


def _spm_reference(text: str, vocab: dict[str, int], scores: list[float], prefix: bool) -> list[int]:
    """llama.cpp's SPM algorithm, written out: merge the best-scoring adjacent pair (leftmost on a
    tie) while the concatenation is a piece; characters that are no piece fall back to bytes."""
    text = ("▁" if prefix else "") + text.replace(" ", "▁")
    symbols = list(text)
    while True:
        best = None
        for i in range(len(symbols) - 1):
            joined = symbols[i] + symbols[i + 1]
            if joined in vocab and (best is None or scores[vocab[joined]] > scores[vocab[best[1]]]):
                best = (i, joined)
        if best is None:
            break
        symbols[best[0] : best[0] + 2] = [best[1]]
    ids = []
    for s in symbols:
        ids += [vocab[s]] if s in vocab else [vocab[f"<0x{b:02X}>"] for b in s.encode()]
    return ids


def _spm_meta(prefix: bool) -> dict:
    pieces = ["a", "b", "c", "▁", "ab", "bc", "abc", "▁a", "▁ab", "ca", "cab", "bb", "▁abc"]
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "\n"]
    tokens += [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [3, 3, 3, 2, 3, 3, 4] + [6] * 256 + [1] * len(pieces)
    scores = [0.0] * (len(tokens) - len(pieces)) + [-float(i) * 1.5 + (3 * i % 7) for i in range(len(pieces))]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_space_prefix": prefix,
    }


@pytest.mark.parametrize("prefix", [False, True])
def test_spm_gguf_vocabulary_follows_llama_cpps_algorithm(prefix):
    import random

    meta = _spm_meta(prefix)
    tok = Tokenizer.from_gguf_metadata(meta)
    tokens, scores = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.scores"]
    vocab = {
        t: i for i, (t, ty) in enumerate(zip(tokens, meta["tokenizer.ggml.token_type"], strict=True)) if ty in (1, 6)
    }
    rng = random.Random(0)
    for _ in range(300):
        text = "".join(rng.choice("abc  é") for _ in range(rng.randint(1, 12)))
        assert tok.encode(text, add_special_tokens=False) == _spm_reference(text, vocab, scores, prefix), text
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    ids = tok.encode("ab<start_of_turn>c\nab", add_special_tokens=True)
    assert ids[0] == 2 and 4 in ids and 6 in ids  # BOS, CONTROL and USER_DEFINED tokens matched whole
