"""A checkpoint no installed loader serves fails with one ``ConfigError`` line listing what is supported.

A GGUF's ``general.architecture`` is refused naming the GGUF architectures the installed loaders
serve (the ones the GGUF store maps); a Hugging Face config's ``model_type`` / ``architectures``
naming the supported ``architectures`` and model types.  Both through ``load_model``, with the
plugins installed in this environment (metrale-qwen3 and metrale-gemma3 among them).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFWriter
from safetensors.torch import save_file

from metrale_core.errors import ConfigError, UnknownArchitecture
from metrale_core.loading.load import load_model


def _tiny_gguf(path: Path, arch: str) -> Path:
    """A GGUF of ``arch`` with a token list and one tensor, and none of llama's hyper-parameters."""
    w = GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_token_list([f"t{i}" for i in range(8)])
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_gguf_of_an_unknown_architecture_lists_the_supported_gguf_architectures(tmp_path):
    path = _tiny_gguf(tmp_path / "mamba.gguf", "mamba")
    with pytest.raises(ConfigError) as err:
        load_model(path, progress=False)
    message = str(err.value)
    assert isinstance(err.value, UnknownArchitecture) and "\n" not in message
    assert message.startswith("GGUF architecture 'mamba' is not supported; supported GGUF architectures: ")
    listed = message.split("supported GGUF architectures: ")[1].split(" (")[0].split(", ")
    assert {"llama", "qwen2", "qwen3", "olmo2", "granite", "smollm3", "gemma2", "gemma3", "phi3"} <= set(listed)
    assert listed == sorted(listed) and "mamba" not in listed


def test_a_hf_config_of_an_unknown_architecture_lists_the_supported_architectures(tmp_path):
    config = {"model_type": "mamba9", "architectures": ["Mamba9ForCausalLM"], "vocab_size": 8, "hidden_size": 4}
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file({"model.embed_tokens.weight": torch.zeros(8, 4)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ConfigError) as err:
        load_model(tmp_path, progress=False)
    message = str(err.value)
    assert isinstance(err.value, UnknownArchitecture) and "\n" not in message
    assert message.startswith("model_type 'mamba9' (architectures: Mamba9ForCausalLM) is not supported; ")
    for arch in ("LlamaForCausalLM", "Qwen3ForCausalLM", "Phi3ForCausalLM", "Gemma2ForCausalLM"):
        assert arch in message.split("supported architectures: ")[1].split(";")[0]
    assert "phi3" in message.split("model types: ")[1]
