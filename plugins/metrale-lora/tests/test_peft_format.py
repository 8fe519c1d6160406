"""PEFT adapter files: scales, key names, and every refusal names the file."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from metrale_core.api import ConfigError
from metrale_lora.peft_format import load_peft, module_of

PREFIX = "base_model.model.model.layers.0.self_attn."


def _write(directory, config=None, tensors=None):
    directory.mkdir(parents=True, exist_ok=True)
    cfg = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}
    cfg.update(config or {})
    (directory / "adapter_config.json").write_text(json.dumps(cfg))
    if tensors is None:
        tensors = {
            PREFIX + "q_proj.lora_A.weight": torch.randn(4, 6),
            PREFIX + "q_proj.lora_B.weight": torch.randn(8, 4),
        }
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    return directory


def test_module_names_and_scales(tmp_path):
    assert module_of(PREFIX + "q_proj.lora_A.weight") == ("model.layers.0.self_attn.q_proj", "A")
    assert module_of(PREFIX + "q_proj.lora_B.default.weight") == ("model.layers.0.self_attn.q_proj", "B")
    assert module_of("base_model.model.lm_head.weight") is None
    plain = load_peft(_write(tmp_path / "plain"))
    ((a, b, scale),) = plain.modules.values()
    assert a.shape == (4, 6) and b.shape == (8, 4) and scale == 2.0 and plain.rank == 4
    rs = load_peft(_write(tmp_path / "rs", {"use_rslora": True}))
    assert next(iter(rs.modules.values()))[2] == pytest.approx(8 / math.sqrt(4))
    pat = load_peft(_write(tmp_path / "pat", {"r": 2, "rank_pattern": {"q_proj": 4}, "alpha_pattern": {"q_proj": 2}}))
    assert next(iter(pat.modules.values()))[2] == 0.5
    assert load_peft(tmp_path / "plain" / "adapter_config.json").source == str(tmp_path / "plain")


@pytest.mark.parametrize(
    "config, message",
    [
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"use_dora": True}, "DoRA"),
        ({"bias": "all"}, "bias"),
        ({"fan_in_fan_out": True}, "fan_in_fan_out"),
        ({"r": 0}, "r must be a positive number"),
        ({"peft_type": "IA3"}, "IA3"),
    ],
)
def test_unsupported_configs_are_refused_naming_the_file(tmp_path, config, message):
    d = _write(tmp_path / "a", config)
    with pytest.raises(ConfigError, match=message) as err:
        load_peft(d)
    assert str(d / "adapter_config.json") in str(err.value)


def test_bad_files_are_refused_naming_them(tmp_path):
    with pytest.raises(ConfigError, match="no such directory"):
        load_peft(tmp_path / "nowhere")
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "adapter_config.json").write_text("{}")
    (pickled / "adapter_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(ConfigError, match=r"adapter_model\.bin: is a pickled checkpoint"):
        load_peft(pickled)
    d = _write(tmp_path / "half", tensors={PREFIX + "q_proj.lora_A.weight": torch.randn(4, 6)})
    with pytest.raises(ConfigError, match=r"adapter_model\.safetensors.*not both A and B"):
        load_peft(d)
    d = _write(tmp_path / "emb", tensors={"base_model.model.model.embed_tokens.lora_embedding_A": torch.randn(4, 6)})
    with pytest.raises(ConfigError, match="not a LoRA A/B matrix"):
        load_peft(d)
    d = _write(
        tmp_path / "rank",
        tensors={
            PREFIX + "q_proj.lora_A.weight": torch.randn(3, 6),
            PREFIX + "q_proj.lora_B.weight": torch.randn(8, 3),
        },
    )
    with pytest.raises(ConfigError, match="rank 3 but the config says 4"):
        load_peft(d)
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "adapter_model.safetensors").write_bytes(b"nonsense")
    (tmp_path / "garbage" / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8}))
    with pytest.raises(ConfigError, match="cannot be read"):
        load_peft(tmp_path / "garbage")
