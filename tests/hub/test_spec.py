"""Hub name parsing and GGUF / HF file choice (llama.cpp ``-hf`` rules)."""

from __future__ import annotations

import pytest

from metrale_core.cli.serve import served_name
from metrale_core.errors import ConfigError
from metrale_core.hub.spec import HubSpec, choose_gguf_files, is_hub_name, parse_spec, wanted_hf_file


def test_parse_forms():
    assert parse_spec("Qwen/Qwen3-0.6B") == HubSpec("Qwen/Qwen3-0.6B")
    assert parse_spec("ggml-org/gemma-3-1b-it-GGUF:q8_0") == HubSpec("ggml-org/gemma-3-1b-it-GGUF", quant="q8_0")
    assert parse_spec("org/r/m-Q2_K.gguf") == HubSpec("org/r", filename="m-Q2_K.gguf")
    with pytest.raises(ConfigError):
        parse_spec("just-a-name")


def test_local_path_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert is_hub_name("org/name")
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert not is_hub_name("org/name")
    assert not is_hub_name("./org/name")


def test_gguf_choice():
    files = ["m-Q8_0.gguf", "m-Q4_K_M.gguf", "mmproj-f16.gguf", "README.md"]
    assert choose_gguf_files(files, None) == ["m-Q4_K_M.gguf"]
    assert choose_gguf_files(files, "q8_0") == ["m-Q8_0.gguf"]
    assert choose_gguf_files(["a-F16.gguf", "b-Q8_0.gguf"], None) == ["a-F16.gguf"]
    split = ["big-Q4_K_M-00002-of-00002.gguf", "big-Q4_K_M-00001-of-00002.gguf", "big-Q8_0.gguf"]
    assert choose_gguf_files(split, "Q4_K_M") == ["big-Q4_K_M-00001-of-00002.gguf", "big-Q4_K_M-00002-of-00002.gguf"]
    assert choose_gguf_files(["config.json"], None) == []
    with pytest.raises(ConfigError):
        choose_gguf_files(files, "IQ1_S")


def test_hf_files_and_served_name():
    keep = ["config.json", "tokenizer.json", "model-00001-of-00002.safetensors", "model.safetensors.index.json"]
    drop = ["pytorch_model.bin", "onnx/model.onnx", "README.md"]
    assert all(wanted_hf_file(f) for f in keep) and not any(wanted_hf_file(f) for f in drop)
    assert served_name("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"
    assert served_name("org/r-GGUF:Q8_0") == "org/r-GGUF"
