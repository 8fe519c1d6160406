"""A multimodal Gemma 3 checkpoint (``Gemma3ForConditionalGeneration``'s layout: the text config
under ``text_config``, the decoder's tensors under ``model.language_model.`` or
``language_model.model.``, vision tensors beside them) serves its text decoder: greedy tokens
through the real engine equal transformers' ``generate`` on the same weights."""

from __future__ import annotations

import json

import gemma3_harness as H
import pytest
import torch
from safetensors.torch import load_file, save_file

from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.plugin.components import LoadOptions
from metrale_core.plugin.discovery import load_registry
from metrale_core.sampling.params import SamplingParams
from metrale_core.weights import open_weights


@pytest.mark.parametrize("prefix", ["model.language_model.", "language_model.model."])
def test_the_text_decoder_of_a_multimodal_checkpoint_is_served(tmp_path, prefix):
    plain = tmp_path / "plain"
    hf = H.save_checkpoint("window6-softcap", plain)
    tensors = {prefix + k.removeprefix("model."): v for k, v in load_file(plain / "model.safetensors").items()}
    tensors["model.vision_tower.patch.weight"] = torch.zeros(2, 2)  # not the text decoder's: never read
    text = json.loads((plain / "config.json").read_text())
    config = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "text_config": text}
    wrapped = tmp_path / "wrapped"
    wrapped.mkdir()
    save_file(tensors, wrapped / "model.safetensors")
    (wrapped / "config.json").write_text(json.dumps(config))

    store = open_weights(wrapped)
    spec = load_registry().find_model_loader(store.config)
    assert spec.name == "gemma3"
    model = spec.factory(store, LoadOptions(weight_format="exact"))
    prompt = list(range(3, 23))
    engine = LLMEngine(model, EngineConfig(block_size=4, num_kv_blocks=64, max_prefill_tokens=64))
    engine.add_request("r", prompt, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    got: list[int] = []
    while engine.has_unfinished():
        for out in engine.step():
            got.extend(out.new_token_ids)
    assert got == H.hf_greedy(hf, prompt, 8)
