"""Test support for the dashboard tests: a tiny random Llama checkpoint with a word-level
tokenizer, a server loader that reports into a ``ServerStatus``, and helpers that read the
rendered screen (Textual's SVG export) as text."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import torch

WORDS = [
    "hello",
    "world",
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    "paris",
    "is",
    "capital",
    "of",
    "france",
    "what",
    "blue",
    "red",
    "green",
    "sky",
    "sea",
    "sun",
    "moon",
    "day",
    "night",
    "one",
    "two",
    "three",
    "yes",
    "no",
    "maybe",
    "good",
    "bad",
    "big",
    "small",
]
SPECIALS = ["<unk>", "<|im_start|>", "<|im_end|>"]
HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 32, 2, 4, 2, 64
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|>"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant{% endif %}"
)


def _tokenizer_json(path: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for word in WORDS:
        vocab[f"▁{word}"] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    backend.add_special_tokens(SPECIALS)
    backend.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "unk_token": "<unk>", "chat_template": TEMPLATE})
    )
    return len(vocab)


def build_tiny_llama(path: Path, seed: int = 0) -> Path:
    """A random 2-layer Llama (safetensors) plus tokenizer files in ``path``."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    vocab = _tokenizer_json(path)
    head_dim = HIDDEN // HEADS
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return (torch.randn(*shape, generator=g) * 0.2).contiguous()

    tensors = {"model.embed_tokens.weight": w(vocab, HIDDEN), "model.norm.weight": torch.ones(HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        tensors.update(
            {
                p + "input_layernorm.weight": torch.ones(HIDDEN),
                p + "post_attention_layernorm.weight": torch.ones(HIDDEN),
                p + "self_attn.q_proj.weight": w(HEADS * head_dim, HIDDEN),
                p + "self_attn.k_proj.weight": w(KV_HEADS * head_dim, HIDDEN),
                p + "self_attn.v_proj.weight": w(KV_HEADS * head_dim, HIDDEN),
                p + "self_attn.o_proj.weight": w(HIDDEN, HEADS * head_dim),
                p + "mlp.gate_proj.weight": w(FFN, HIDDEN),
                p + "mlp.up_proj.weight": w(FFN, HIDDEN),
                p + "mlp.down_proj.weight": w(HIDDEN, FFN),
            }
        )
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "architectures": ["LlamaForCausalLM"],
                "vocab_size": vocab,
                "hidden_size": HIDDEN,
                "intermediate_size": FFN,
                "num_hidden_layers": LAYERS,
                "num_attention_heads": HEADS,
                "num_key_value_heads": KV_HEADS,
                "rms_norm_eps": 1e-5,
                "rope_theta": 10000.0,
                "max_position_embeddings": 256,
                "tie_word_embeddings": True,
                "eos_token_id": 2,
                "bos_token_id": None,
            }
        )
    )
    return path


_TEXT_RE = re.compile(r'<text class="[^"]*-r\d+" x="([\d.]+)" y="([\d.]+)"[^>]*>(.*?)</text>', re.S)
_CELL_W, _LINE_H, _TOP = 12.2, 24.4, 20.0


def svg_text(svg: str) -> str:
    """The text of a Textual SVG screenshot, one screen row per line (cells placed by x)."""
    rows: dict[int, list[str]] = {}
    for x, y, body in _TEXT_RE.findall(svg):
        row = rows.setdefault(round((float(y) - _TOP) / _LINE_H), [])
        col = round(float(x) / _CELL_W)
        text = html.unescape(body).replace("\xa0", " ")
        if len(row) < col + len(text):
            row.extend(" " * (col + len(text) - len(row)))
        row[col : col + len(text)] = list(text)
    return "\n".join("".join(rows.get(i, [])).rstrip() for i in range(max(rows, default=-1) + 1))


def screen_text(app) -> str:
    return svg_text(app.export_screenshot())


def make_loader(status, path: Path, registry, **engine_options):
    """A server loader that reports its phases and weight progress into ``status``."""
    from metrale_core.engine import EngineConfig, LLMEngine
    from metrale_core.loading.load import load_model
    from metrale_core.server import ServedModel

    def load():
        with status.phase("weights"):
            status.start_load()
            loaded = load_model(path, registry=registry, progress=False, on_tensor=status.tensor_loaded)
        with status.phase("engine"):
            options = dict(block_size=4, num_kv_blocks=128, max_num_seqs=8)
            options.update(engine_options)
            engine = LLMEngine(loaded.model, EngineConfig(**options), tokenizer=loaded.tokenizer, registry=registry)
        return ServedModel(engine=engine, tokenizer=loaded.tokenizer, model_type="llama")

    return load


async def wait_for(pilot, predicate, timeout: float = 20.0, what: str = "condition"):
    """Let the app run until ``predicate()`` is true."""
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.05)
